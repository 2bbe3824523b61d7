/**
 * The Kubernetes API calls of the updater, through @kubernetes/client-node, behind a small interface (KubeApi) so
 * the controller can be driven by tests without an API server.
 *
 *   GET    /apis/apps/v1/namespaces/<ns>/statefulsets/<name>            (or deployments)  getWorkload
 *   GET    ...?watch=true&fieldSelector=metadata.name=<name>&resourceVersion=<rv>      watchWorkload
 *   PATCH  /apis/apps/v1/namespaces/<ns>/statefulsets/<name>                              setImage
 *          Content-Type: application/strategic-merge-patch+json
 *          {"spec":{"template":{"spec":{"containers":[{"name":"gateway","image":"<repo>:<tag>"}]}}}}
 *   GET    /api/v1/namespaces/<ns>/secrets/<name>                        readSecretKey (the exported schedule)
 *   PATCH  /api/v1/namespaces/<ns>/secrets/<name>  (merge patch; POST to create it when missing)  writeSecretKey:
 *          what a Kubernetes agent uses to export its schedule and its host id (kubeScheduleWriter), which the
 *          updater sends with its group when it asks the Proxy for the managed rollout's instruction
 *
 * Which API server: --kubeconfig / KUBECONFIG / ~/.kube/config when given, else the pod's service account
 * (KUBERNETES_SERVICE_HOST and /var/run/secrets/kubernetes.io/serviceaccount). The API server is reached
 * directly: HTTPS_PROXY does not apply to it, only to the version server.
 */
import { existsSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { AppsV1Api, CoreV1Api, KubeConfig, PatchStrategy, Watch, setHeaderOptions, type V1Deployment, type V1StatefulSet } from '@kubernetes/client-node';
import { GatewayError } from '../../errors.js';
import type { AgentWorkload, WorkloadKind } from './decide.js';

export interface WorkloadRef {
  kind: WorkloadKind;
  namespace: string;
  name: string;
}

export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK' | 'ERROR';

export interface WatchHandle {
  stop(): void;
}

export interface KubeApi {
  /** The resource as the updater sees it, with its resourceVersion (to start a watch from). */
  getWorkload(ref: WorkloadRef): Promise<{ workload: AgentWorkload; resourceVersion: string }>;
  /** Sets one container's image in the pod template (a strategic merge patch: other containers are kept). */
  setImage(ref: WorkloadRef, container: string, image: string): Promise<void>;
  /** One key of a Secret, decoded; undefined when the Secret or the key does not exist. */
  readSecretKey(namespace: string, name: string, key: string): Promise<string | undefined>;
  /**
   * Sets one key of a Secret, and the `extra` keys in the same merge patch (the Secret is created when missing). The
   * agent's schedule export (extra: its host id).
   */
  writeSecretKey(namespace: string, name: string, key: string, value: string, extra?: Readonly<Record<string, string>>): Promise<void>;
  /**
   * Watches the one resource. onEvent gets each event (BOOKMARK events carry only a resourceVersion); onDone is
   * called once when the stream ends, with an error when it failed.
   */
  watchWorkload(
    ref: WorkloadRef,
    resourceVersion: string | undefined,
    onEvent: (type: WatchEventType, workload: AgentWorkload | undefined, resourceVersion: string | undefined) => void,
    onDone: (err?: Error) => void,
  ): Promise<WatchHandle>;
}

type Workload = V1StatefulSet | V1Deployment;

export function toAgentWorkload(kind: WorkloadKind, obj: Workload): AgentWorkload {
  return {
    kind,
    namespace: obj.metadata?.namespace ?? '',
    name: obj.metadata?.name ?? '',
    annotations: { ...(obj.metadata?.annotations ?? {}) },
    containers: (obj.spec?.template?.spec?.containers ?? []).map((c) => ({ name: c.name, image: c.image ?? '' })),
  };
}

/** The body of the image update: a strategic merge patch keyed by container name. */
export function imagePatch(container: string, image: string): object {
  return { spec: { template: { spec: { containers: [{ name: container, image }] } } } };
}

function plural(kind: WorkloadKind): string {
  return kind === 'StatefulSet' ? 'statefulsets' : 'deployments';
}

/** client-node's ApiException (code, body) or a fetch failure → GW_ERR_KUBE_API naming the call. */
function apiError(call: string, err: unknown): GatewayError {
  const e = err as { code?: unknown; body?: unknown; message?: string; statusCode?: number };
  const status = typeof e.code === 'number' ? e.code : e.statusCode;
  let reason = e.message ?? String(err);
  if (typeof e.body === 'string') {
    try {
      const parsed = JSON.parse(e.body) as { message?: string };
      if (parsed.message) reason = parsed.message;
    } catch {
      // not a Status object
    }
  } else if (e.body && typeof e.body === 'object' && 'message' in e.body) {
    reason = String((e.body as { message: unknown }).message);
  }
  const hint =
    status === 403
      ? "The updater's service account lacks a permission: the chart's Role grants get, watch and patch on the agent resource and get on its schedule Secret."
      : undefined;
  return new GatewayError('GW_ERR_KUBE_API', `${call}: ${status ? `HTTP ${status}: ` : ''}${reason.split('\n')[0]}`, {
    cause: err,
    details: { call, ...(status ? { status } : {}) },
    ...(hint ? { hint } : {}),
  });
}

function notFound(err: unknown): boolean {
  const e = err as { code?: unknown; statusCode?: unknown };
  return e.code === 404 || e.statusCode === 404;
}

/**
 * The kubeconfig: the file given (or KUBECONFIG, or ~/.kube/config when it exists), else the pod's service account.
 * GW_ERR_KUBE_CONFIG when there is neither.
 */
export function loadKubeConfig(options: { kubeconfig?: string; env?: NodeJS.ProcessEnv; home?: string } = {}): KubeConfig {
  const env = options.env ?? process.env;
  const home = options.home ?? homedir();
  const kc = new KubeConfig();
  try {
    const file = options.kubeconfig ?? env.KUBECONFIG ?? (existsSync(join(home, '.kube', 'config')) ? join(home, '.kube', 'config') : undefined);
    if (file) {
      kc.loadFromFile(file);
    } else if (env.KUBERNETES_SERVICE_HOST && env.KUBERNETES_SERVICE_PORT) {
      kc.loadFromCluster();
    } else {
      throw new Error('not running in a pod (no KUBERNETES_SERVICE_HOST) and no kubeconfig (--kubeconfig, KUBECONFIG, ~/.kube/config)');
    }
  } catch (err) {
    if (err instanceof GatewayError) throw err;
    throw new GatewayError('GW_ERR_KUBE_CONFIG', `cannot load the Kubernetes configuration: ${(err as Error).message}`, { cause: err });
  }
  if (!kc.getCurrentCluster()) {
    throw new GatewayError('GW_ERR_KUBE_CONFIG', 'the Kubernetes configuration names no current cluster');
  }
  return kc;
}

/** KubeApi on @kubernetes/client-node. */
export class ClientNodeKubeApi implements KubeApi {
  private readonly apps: AppsV1Api;
  private readonly core: CoreV1Api;
  private readonly watcher: Watch;

  constructor(readonly kubeConfig: KubeConfig) {
    this.apps = kubeConfig.makeApiClient(AppsV1Api);
    this.core = kubeConfig.makeApiClient(CoreV1Api);
    this.watcher = new Watch(kubeConfig);
  }

  async getWorkload(ref: WorkloadRef): Promise<{ workload: AgentWorkload; resourceVersion: string }> {
    const call = `get ${ref.kind} ${ref.namespace}/${ref.name}`;
    let obj: Workload;
    try {
      obj =
        ref.kind === 'StatefulSet'
          ? await this.apps.readNamespacedStatefulSet({ name: ref.name, namespace: ref.namespace })
          : await this.apps.readNamespacedDeployment({ name: ref.name, namespace: ref.namespace });
    } catch (err) {
      throw apiError(call, err);
    }
    return { workload: toAgentWorkload(ref.kind, obj), resourceVersion: obj.metadata?.resourceVersion ?? '' };
  }

  async setImage(ref: WorkloadRef, container: string, image: string): Promise<void> {
    const call = `patch ${ref.kind} ${ref.namespace}/${ref.name}`;
    const options = setHeaderOptions('Content-Type', PatchStrategy.StrategicMergePatch);
    const request = { name: ref.name, namespace: ref.namespace, body: imagePatch(container, image), fieldManager: 'gateway-kube-updater' };
    try {
      if (ref.kind === 'StatefulSet') await this.apps.patchNamespacedStatefulSet(request, options);
      else await this.apps.patchNamespacedDeployment(request, options);
    } catch (err) {
      throw apiError(call, err);
    }
  }

  async readSecretKey(namespace: string, name: string, key: string): Promise<string | undefined> {
    try {
      const secret = await this.core.readNamespacedSecret({ name, namespace });
      const value = secret.data?.[key];
      return value === undefined ? undefined : Buffer.from(value, 'base64').toString('utf8');
    } catch (err) {
      if (notFound(err)) return undefined;
      throw apiError(`get Secret ${namespace}/${name}`, err);
    }
  }

  async writeSecretKey(namespace: string, name: string, key: string, value: string, extra: Readonly<Record<string, string>> = {}): Promise<void> {
    const data: Record<string, string> = {};
    for (const [k, v] of Object.entries({ ...extra, [key]: value })) data[k] = Buffer.from(v, 'utf8').toString('base64');
    try {
      await this.core.patchNamespacedSecret({ name, namespace, body: { data } }, setHeaderOptions('Content-Type', PatchStrategy.MergePatch));
      return;
    } catch (err) {
      if (!notFound(err)) throw apiError(`patch Secret ${namespace}/${name}`, err);
    }
    try {
      await this.core.createNamespacedSecret({ namespace, body: { apiVersion: 'v1', kind: 'Secret', metadata: { name, namespace }, type: 'Opaque', data } });
    } catch (err) {
      throw apiError(`create Secret ${namespace}/${name}`, err);
    }
  }

  async watchWorkload(
    ref: WorkloadRef,
    resourceVersion: string | undefined,
    onEvent: (type: WatchEventType, workload: AgentWorkload | undefined, resourceVersion: string | undefined) => void,
    onDone: (err?: Error) => void,
  ): Promise<WatchHandle> {
    const path = `/apis/apps/v1/namespaces/${encodeURIComponent(ref.namespace)}/${plural(ref.kind)}`;
    const controller = await this.watcher.watch(
      path,
      {
        fieldSelector: `metadata.name=${ref.name}`,
        allowWatchBookmarks: true,
        ...(resourceVersion ? { resourceVersion } : {}),
      },
      (type: string, obj: Workload & { code?: number; message?: string }) => {
        if (type === 'ERROR') {
          // A Status object: 410 Gone means the resourceVersion is too old; the controller lists again.
          onEvent('ERROR', undefined, undefined);
          return;
        }
        const rv = obj?.metadata?.resourceVersion;
        onEvent(type as WatchEventType, type === 'BOOKMARK' ? undefined : toAgentWorkload(ref.kind, obj), rv);
      },
      (err: unknown) => onDone(err ? apiError(`watch ${ref.kind} ${ref.namespace}/${ref.name}`, err) : undefined),
    );
    return { stop: () => controller.abort() };
  }
}

/** The key of the shared-state Secret holding the agent's host id (the updater asks the rollout with it). */
export const HOST_ID_SECRET_KEY = 'agent-host-id';

/**
 * For a Kubernetes agent's schedule export (startScheduleExport's writeKubeState in src/upgrade/schedule.ts):
 * writes the JSON into the Secret the updater reads, and with it the agent's host id (HOST_ID_SECRET_KEY) when
 * given, so that the updater asks the managed rollout for this agent (a canary is picked by host id). In the pod,
 * with the chart's Role for the agent.
 */
export function kubeScheduleWriter(options: {
  namespace: string;
  secretName: string;
  key?: string;
  hostId?: string;
  api?: KubeApi;
  env?: NodeJS.ProcessEnv;
}): (json: string) => Promise<void> {
  let api = options.api;
  const extra: Record<string, string> = options.hostId ? { [HOST_ID_SECRET_KEY]: options.hostId } : {};
  return async (json) => {
    api ??= new ClientNodeKubeApi(loadKubeConfig(options.env ? { env: options.env } : {}));
    await api.writeSecretKey(options.namespace, options.secretName, options.key ?? 'agent-maintenance-schedule', json, extra);
  };
}
