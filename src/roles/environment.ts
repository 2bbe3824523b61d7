/**
 * What a gateway process takes from its environment besides the configuration file. The CLI builds it from
 * process.env and passes it down; the daemon and the role starters read no environment variable themselves.
 */
import { resolveSettings } from '../upgrade/settings.js';

export type Env = Readonly<Record<string, string | undefined>>;

export interface DaemonEnvironment {
  /**
   * The variables the Dialer reads on every dial (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, NO_PROXY, lower-case too)
   * and the Kubernetes client reads (KUBECONFIG, KUBERNETES_SERVICE_HOST): the process's own, live.
   */
  readonly env: Env;
  /**
   * The upgrader's directory (GATEWAY_UPGRADE_DIR, or under GATEWAY_UPGRADE_ROOT): where an agent exports its
   * maintenance schedule when it exists. A function, because resolving it checks every GATEWAY_UPGRADE_* variable
   * and throws on a bad one, which only an agent's start may do.
   */
  upgraderDir(): string;
  /** GATEWAY_KUBE_SCHEDULE_FILE: the agent also writes its schedule as JSON to this file. */
  readonly kubeScheduleFile?: string;
  /** POD_NAMESPACE and GATEWAY_KUBE_SCHEDULE_SECRET, when both are set: the Secret the schedule goes into. */
  readonly kubeScheduleSecret?: { namespace: string; secretName: string };
}

/** The environment of a process, from its variables (an empty value counts as unset). */
export function daemonEnvironment(env: Env): DaemonEnvironment {
  const kubeScheduleFile = env.GATEWAY_KUBE_SCHEDULE_FILE || undefined;
  const secretName = env.GATEWAY_KUBE_SCHEDULE_SECRET;
  const namespace = env.POD_NAMESPACE;
  return {
    env,
    upgraderDir: () => resolveSettings(env).etcDir,
    ...(kubeScheduleFile ? { kubeScheduleFile } : {}),
    ...(secretName && namespace ? { kubeScheduleSecret: { namespace, secretName } } : {}),
  };
}
