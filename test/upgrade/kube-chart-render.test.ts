/**
 * The chart deploy/gateway-kube-agent rendered by the real Helm (kube-chart.test.ts reads its text): `helm lint
 * --strict` and `helm template` for each combination of values the chart documents, and the rendered objects
 * checked as a cluster would take them: the agent's service account may impersonate users, groups and service
 * accounts (and is bound to that ClusterRole), the agent authenticates with its in-cluster token, its liveness
 * and readiness probes ask the health endpoints its configuration serves, the updater gets exactly its Role. helm and kubectl come from scripts/install-kubetools.sh (.cache/kubetools/).
 *
 * `kubectl apply --dry-run=client` is not run: even client-side it downloads the API server's OpenAPI schema and
 * discovery documents, so it needs a reachable API server (none can run here).
 */
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import { parseConfig } from '../../src/config/index.js';

const CHART = fileURLToPath(new URL('../../deploy/gateway-kube-agent/', import.meta.url));
const HELM = fileURLToPath(new URL('../../.cache/kubetools/helm', import.meta.url));
const REQUIRED = ['proxyAddr=gateway.example.com:443', 'caPin=sha256:0011', 'kubeClusterName=prod'];

interface K8sObject {
  kind: string;
  metadata: { name: string; namespace?: string };
  [k: string]: unknown;
}
interface Probe {
  httpGet: { path: string; port: string | number };
}
interface Container {
  name: string;
  ports?: Array<{ name: string; containerPort: number }>;
  livenessProbe?: Probe;
  readinessProbe?: Probe;
}
interface Rule {
  apiGroups: string[];
  resources: string[];
  verbs: string[];
}

function helm(args: string[]): { status: number; stdout: string; stderr: string } {
  if (!existsSync(HELM)) throw new Error(`${HELM} is missing: run scripts/install-kubetools.sh (scripts/install-test-deps.sh runs it)`);
  const r = spawnSync(HELM, args, { encoding: 'utf8', timeout: 60_000, env: { PATH: process.env.PATH ?? '', HOME: '/nonexistent', HELM_CACHE_HOME: '/tmp/helm-cache-test', HELM_CONFIG_HOME: '/tmp/helm-config-test', HELM_DATA_HOME: '/tmp/helm-data-test' } });
  return { status: r.status ?? -1, stdout: r.stdout, stderr: r.stderr };
}

function sets(values: string[]): string[] {
  return [...REQUIRED, ...values].flatMap((v) => ['--set', v]);
}

function render(values: string[]): K8sObject[] {
  const r = helm(['template', 'agent', CHART, '--namespace', 'gw', ...sets(values)]);
  expect(r.stderr, r.stderr).toBe('');
  expect(r.status).toBe(0);
  return parseAllDocuments(r.stdout)
    .map((d) => d.toJS() as K8sObject | null)
    .filter((o): o is K8sObject => o !== null);
}

const one = (objects: K8sObject[], kind: string, name?: string): K8sObject => {
  const found = objects.filter((o) => o.kind === kind && (name === undefined || o.metadata.name === name));
  expect(found.map((o) => o.metadata.name), kind).toHaveLength(1);
  return found[0]!;
};
const allows = (rules: Rule[], group: string, resource: string, verb: string) =>
  rules.some((r) => r.apiGroups.includes(group) && r.resources.includes(resource) && r.verbs.includes(verb));

/** The combinations values.yaml documents. */
const COMBINATIONS: Array<[string, string[]]> = [
  ['defaults (StatefulSet, token in the chart, no updater)', ['authToken=t0ken']],
  ['a Deployment', ['authToken=t0ken', 'agentKind=Deployment']],
  ['an existing join-token Secret', ['joinTokenSecret=my-token']],
  ['the updater enabled', ['authToken=t0ken', 'updater.enabled=true']],
  ['the updater with a Proxy CA and a channel', ['authToken=t0ken', 'updater.enabled=true', 'updater.proxyCASecret=proxy-ca', 'updater.releaseChannel=stable/rolling']],
  ['the updater of a Deployment', ['authToken=t0ken', 'agentKind=Deployment', 'updater.enabled=true']],
  ['a ClusterRole name of its own', ['authToken=t0ken', 'rbac.clusterRoleName=gateway-impersonator']],
  ['no RBAC created', ['authToken=t0ken', 'rbac.create=false']],
  ['another health port', ['authToken=t0ken', 'diagPort=8081']],
  ['the updater in a rollout group of its own', ['authToken=t0ken', 'updater.enabled=true', 'updater.group=prod-eu']],
];

describe('helm lint --strict and helm template, for each documented combination of values', () => {
  it.each(COMBINATIONS)('%s', (_name, values) => {
    const lint = helm(['lint', '--strict', CHART, ...sets(values)]);
    expect(lint.status, lint.stdout + lint.stderr).toBe(0);
    const objects = render(values);
    const agentKind = values.includes('agentKind=Deployment') ? 'Deployment' : 'StatefulSet';
    const agent = one(objects, agentKind, 'agent');
    const pod = (agent as unknown as { spec: { template: { spec: { serviceAccountName: string; containers: Container[] } } } }).spec.template.spec;
    expect(pod.serviceAccountName).toBe('agent');

    const bindings = objects.filter((o) => o.kind === 'ClusterRoleBinding');
    if (values.includes('rbac.create=false')) {
      expect(objects.filter((o) => o.kind === 'ClusterRole' || o.kind === 'ClusterRoleBinding')).toEqual([]);
    } else {
      const roleName = values.find((v) => v.startsWith('rbac.clusterRoleName='))?.split('=')[1] ?? 'agent';
      const clusterRole = one(objects, 'ClusterRole', roleName) as K8sObject & { rules: Rule[] };
      for (const resource of ['users', 'groups', 'serviceaccounts']) expect(allows(clusterRole.rules, '', resource, 'impersonate'), resource).toBe(true);
      // Nothing but impersonation: what an impersonated user may do is the cluster's RBAC for that user.
      expect(clusterRole.rules.flatMap((r) => r.verbs)).toEqual(['impersonate']);
      const binding = one(objects, 'ClusterRoleBinding', roleName) as K8sObject & { roleRef: { kind: string; name: string }; subjects: Array<{ kind: string; name: string; namespace: string }> };
      expect(binding.roleRef).toEqual({ apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: roleName });
      expect(binding.subjects).toEqual([{ kind: 'ServiceAccount', name: pod.serviceAccountName, namespace: 'gw' }]);
      expect(bindings).toHaveLength(1);
    }
    one(objects, 'ServiceAccount', pod.serviceAccountName);

    // The agent's configuration parses, and authenticates with the pod's service-account token.
    const config = one(objects, 'ConfigMap', 'agent') as K8sObject & { data: Record<string, string> };
    const parsed = parseConfig(config.data['gateway.yaml']!, 'chart gateway.yaml');
    // Liveness and readiness ask the agent's health endpoints, on the port its configuration listens on.
    const gateway = pod.containers.find((c) => c.name === 'gateway')!;
    expect(gateway.livenessProbe?.httpGet).toEqual({ path: '/healthz', port: 'diag' });
    expect(gateway.readinessProbe?.httpGet).toEqual({ path: '/readyz', port: 'diag' });
    expect(gateway.ports).toEqual([{ name: 'diag', containerPort: parsed.gateway.diag_addr!.port }]);
    expect(parsed.gateway.diag_addr).toEqual({ host: '0.0.0.0', port: values.includes('diagPort=8081') ? 8081 : 3000 });
    // The agent says its rollout group; the updater asks for the same one (default: the release's name).
    const group = values.find((v) => v.startsWith('updater.group='))?.split('=')[1] ?? 'agent';
    expect(parsed.gateway.upgrade_group).toBe(group);
    expect(parsed.kube_service.clusters).toMatchObject([{ name: 'prod', api_server: 'https://kubernetes.default.svc', credentials: 'in_cluster', service_account_dir: '/var/run/secrets/kubernetes.io/serviceaccount' }]);

    const updater = objects.filter((o) => o.kind === 'Deployment' && o.metadata.name.endsWith('-updater'));
    if (values.includes('updater.enabled=true')) {
      expect(updater).toHaveLength(1);
      // Its own health endpoints and /metrics (its last result), probed as the agent's are.
      const u = (updater[0] as K8sObject & { spec: { template: { spec: { containers: Array<{ args: string[]; ports?: unknown; livenessProbe?: { httpGet: unknown }; readinessProbe?: { httpGet: unknown } }> } } } }).spec.template.spec.containers[0]!;
      const port = values.includes('diagPort=8081') ? 8081 : 3000;
      expect(u.args).toContain(`--diag-addr=0.0.0.0:${port}`);
      expect(u.args).toContain(`--group=${group}`);
      expect(u.ports).toEqual([{ name: 'diag', containerPort: port }]);
      expect(u.livenessProbe?.httpGet).toEqual({ path: '/healthz', port: 'diag' });
      expect(u.readinessProbe?.httpGet).toEqual({ path: '/readyz', port: 'diag' });
      const role = one(objects, 'Role', 'agent-updater') as K8sObject & { rules: Rule[] };
      for (const verb of ['get', 'list', 'watch', 'patch']) expect(allows(role.rules, 'apps', agentKind === 'Deployment' ? 'deployments' : 'statefulsets', verb)).toBe(true);
      expect(allows(role.rules, '', 'secrets', 'get')).toBe(true);
      const binding = one(objects, 'RoleBinding', 'agent-updater') as K8sObject & { subjects: Array<{ name: string }> };
      expect(binding.subjects.map((s) => s.name)).toEqual(['agent-updater']);
    } else {
      expect(updater).toEqual([]);
    }
  });
});

describe("the rollout group's default: the release's name, dots as \"-\", cut to 32 characters", () => {
  it('a release named longer than 32 characters gets its first 32, without a trailing "-"', () => {
    const release = 'gateway-agent-of-the-eu-west-cluster-01';
    const r = helm(['template', release, CHART, '--namespace', 'gw', ...sets(['authToken=t0ken', 'updater.enabled=true'])]);
    expect(r.status, r.stderr).toBe(0);
    const objects = parseAllDocuments(r.stdout).map((d) => d.toJS() as K8sObject | null).filter((o): o is K8sObject => o !== null);
    const config = one(objects, 'ConfigMap', release) as K8sObject & { data: Record<string, string> };
    expect(release.slice(0, 32)).toBe('gateway-agent-of-the-eu-west-clu');
    expect(parseConfig(config.data['gateway.yaml']!, 'chart gateway.yaml').gateway.upgrade_group).toBe('gateway-agent-of-the-eu-west-clu');
    // Cut where the 32nd character is a "-": the group ends before it.
    const r2 = helm(['template', 'gateway-agent-of-the-eu-west-cl-x', CHART, '--namespace', 'gw', ...sets(['authToken=t0ken'])]);
    expect(r2.status, r2.stderr).toBe(0);
    expect(r2.stdout).toMatch(/^ {6}upgrade_group: gateway-agent-of-the-eu-west-cl$/m);
    // Helm allows dots in a release's name; a group does not.
    const r3 = helm(['template', 'agent.eu-west', CHART, '--namespace', 'gw', ...sets(['authToken=t0ken', 'updater.enabled=true'])]);
    expect(r3.status, r3.stderr).toBe(0);
    expect(r3.stdout).toMatch(/^ {6}upgrade_group: agent-eu-west$/m);
    expect(r3.stdout).toContain('- --group=agent-eu-west\n');
  });
});

describe('restarts that keep sessions (docs/upgrades.md)', () => {
  type Workload = K8sObject & { spec: { strategy?: unknown; updateStrategy?: unknown; template: { spec: { terminationGracePeriodSeconds: number } } } };
  const gatewayOf = (objects: K8sObject[]) => parseConfig((one(objects, 'ConfigMap', 'agent') as K8sObject & { data: Record<string, string> }).data['gateway.yaml']!, 'chart').gateway;
  const drainOf = (objects: K8sObject[]) => gatewayOf(objects).drain_limit;

  it('a Deployment surges (maxSurge 1, maxUnavailable 0) and gives the old pod the drain limit and a minute to drain', () => {
    const objects = render(['authToken=t0ken', 'agentKind=Deployment']);
    const agent = one(objects, 'Deployment', 'agent') as Workload;
    expect(agent.spec.strategy).toEqual({ type: 'RollingUpdate', rollingUpdate: { maxSurge: 1, maxUnavailable: 0 } });
    expect(drainOf(objects)).toBe(1800_000);
    // Its old pod drains on SIGTERM; a StatefulSet's (below) stops at once, its new pod waiting for it.
    expect(gatewayOf(objects).drain_on_stop).toBe(true);
    expect(agent.spec.template.spec.terminationGracePeriodSeconds).toBe(1860);
  });

  it('a StatefulSet (one volume: no surge) rolls one pod at a time, with the same grace period; drainLimitSeconds sets both', () => {
    const objects = render(['authToken=t0ken', 'drainLimitSeconds=600']);
    const agent = one(objects, 'StatefulSet', 'agent') as Workload;
    expect(agent.spec.updateStrategy).toEqual({ type: 'RollingUpdate' });
    expect(agent.spec.strategy).toBeUndefined();
    expect(drainOf(objects)).toBe(600_000);
    expect(gatewayOf(objects).drain_on_stop).toBe(false);
    expect(agent.spec.template.spec.terminationGracePeriodSeconds).toBe(660);
  });
});

describe('hostile values: helm refuses them with the reason', () => {
  it.each([
    ['an agentKind that is neither StatefulSet nor Deployment', ['authToken=t', 'agentKind=DaemonSet'], /agentKind must be StatefulSet or Deployment/],
    ['no proxyAddr', ['authToken=t', 'proxyAddr='], /proxyAddr is required/],
    ['no kubeClusterName', ['authToken=t', 'kubeClusterName='], /kubeClusterName is required/],
    ['a group with capitals', ['authToken=t', 'updater.group=Prod'], /updater.group must be 1 to 32 characters of a-z, 0-9 and "-", not "Prod"/],
    ['a group of 33 characters', ['authToken=t', `updater.group=${'g'.repeat(33)}`], /updater.group must be 1 to 32 characters/],
    ['a group that would break out of the YAML', ['authToken=t', 'updater.group=a\nb: c'], /updater.group must be/],
    ['a drain limit of 0', ['authToken=t', 'drainLimitSeconds=0'], /drainLimitSeconds must be a whole number of seconds above 0/],
    ['a negative drain limit', ['authToken=t', 'drainLimitSeconds=-5'], /drainLimitSeconds must be a whole number/],
    ['a fraction of a second', ['authToken=t', 'drainLimitSeconds=1.5'], /drainLimitSeconds must be a whole number/],
    ['a drain limit that is no number', ['authToken=t', 'drainLimitSeconds=forever'], /drainLimitSeconds must be a whole number/],
  ])('%s', (_name, values, message) => {
    const r = helm(['template', 'agent', CHART, ...sets(values)]);
    expect(r.status).not.toBe(0);
    expect(r.stderr).toMatch(message);
  });
});
