/**
 * The stand-in API server's resources: legacy discovery (/api, /apis, /api/v1; kubectl 1.33 asks for aggregated
 * discovery first and falls back when the answer is a plain APIVersions), /version, and pods (list, one, as a
 * Table when kubectl asks for one, as `kubectl get pods` does) with their log subresource (`follow=true` streams
 * a line at a time, chunked, until the client goes). /openapi/* answers 404: kubectl's get, exec, port-forward
 * and logs do not need it.
 *
 * Not the real thing: a fixed set of pods the test names (no etcd, no scheduler, no kubelet); every write
 * answers 405 after authorization.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { notFound, type Status } from './status.js';

export interface PodSpec {
  name: string;
  namespace?: string;
  containers?: string[];
  /** Container port → a TCP port on 127.0.0.1 where port-forward connects (the test runs that server). */
  ports?: Record<number, number>;
}

export interface Pod {
  name: string;
  namespace: string;
  containers: string[];
  ports: Record<number, number>;
  created: string;
}

export const CREATED = '2026-01-01T00:00:00Z';

export function podObject(p: Pod): Record<string, unknown> {
  return {
    kind: 'Pod', apiVersion: 'v1',
    metadata: { name: p.name, namespace: p.namespace, uid: `uid-${p.namespace}-${p.name}`, resourceVersion: '1', creationTimestamp: p.created },
    spec: { nodeName: 'standin', containers: p.containers.map((name) => ({ name, image: 'standin:1' })) },
    status: {
      phase: 'Running', podIP: '10.0.0.2',
      conditions: [{ type: 'Ready', status: 'True' }],
      containerStatuses: p.containers.map((name) => ({ name, ready: true, started: true, restartCount: 0, image: 'standin:1', imageID: '', state: { running: { startedAt: p.created } } })),
    },
  };
}

function podTable(pods: Pod[]): Record<string, unknown> {
  const col = (name: string, type: string, format = '') => ({ name, type, format, description: name, priority: 0 });
  return {
    kind: 'Table', apiVersion: 'meta.k8s.io/v1', metadata: { resourceVersion: '1' },
    columnDefinitions: [col('Name', 'string', 'name'), col('Ready', 'string'), col('Status', 'string'), col('Restarts', 'string'), col('Age', 'string')],
    rows: pods.map((p) => ({
      cells: [p.name, `${p.containers.length}/${p.containers.length}`, 'Running', '0', '1d'],
      object: { kind: 'PartialObjectMetadata', apiVersion: 'meta.k8s.io/v1', metadata: { name: p.name, namespace: p.namespace, creationTimestamp: p.created } },
    })),
  };
}

const DISCOVERY: Record<string, unknown> = {
  '/api': { kind: 'APIVersions', versions: ['v1'], serverAddressByClientCIDRs: [{ clientCIDR: '0.0.0.0/0', serverAddress: '127.0.0.1:6443' }] },
  '/apis': { kind: 'APIGroupList', apiVersion: 'v1', groups: [] },
  '/api/v1': {
    kind: 'APIResourceList', groupVersion: 'v1',
    resources: [
      { name: 'namespaces', singularName: 'namespace', namespaced: false, kind: 'Namespace', verbs: ['get', 'list'], shortNames: ['ns'] },
      { name: 'pods', singularName: 'pod', namespaced: true, kind: 'Pod', verbs: ['get', 'list'], shortNames: ['po'], categories: ['all'] },
      { name: 'pods/exec', singularName: '', namespaced: true, kind: 'PodExecOptions', verbs: ['create', 'get'] },
      { name: 'pods/log', singularName: '', namespaced: true, kind: 'Pod', verbs: ['get'] },
      { name: 'pods/portforward', singularName: '', namespaced: true, kind: 'PodPortForwardOptions', verbs: ['create', 'get'] },
    ],
  },
  '/version': { major: '1', minor: '33', gitVersion: 'v1.33.0-standin', platform: 'linux/amd64' },
};

export type Answer = { status: Status } | { json: unknown } | { stream: 'log'; pod: Pod };

/** A read of a path kubectl asks for, after authorization. */
export function read(url: URL, accept: string, pods: Pod[]): Answer {
  const d = DISCOVERY[url.pathname];
  if (d !== undefined) return { json: d };
  const m = /^\/api\/v1\/namespaces\/([^/]+)\/pods(?:\/([^/]+)(?:\/(log))?)?$/.exec(url.pathname);
  if (!m) return { status: { ...notFound('', ''), message: 'the server could not find the requested resource', details: {} } };
  const [, ns, name, sub] = m;
  const inNs = pods.filter((p) => p.namespace === ns);
  if (name === undefined) {
    if (accept.includes('as=Table')) return { json: podTable(inNs) };
    return { json: { kind: 'PodList', apiVersion: 'v1', metadata: { resourceVersion: '1' }, items: inNs.map(podObject) } };
  }
  const pod = inNs.find((p) => p.name === name);
  if (!pod) return { status: notFound('pods', name) };
  return sub === 'log' ? { stream: 'log', pod } : { json: podObject(pod) };
}

/** GET .../log: `count` lines then the end, or with follow=true one line every `everyMs` until the client goes. */
export function streamLog(req: IncomingMessage, res: ServerResponse, pod: Pod, url: URL, everyMs: number, open: { count: number }): void {
  const container = url.searchParams.get('container') ?? pod.containers[0]!;
  res.writeHead(200, { 'content-type': 'text/plain', 'transfer-encoding': 'chunked' });
  let n = 0;
  const line = () => `${pod.name}/${container} line ${++n}\n`;
  if (url.searchParams.get('follow') !== 'true') {
    res.end(line() + line() + line());
    return;
  }
  res.write(line());
  const timer = setInterval(() => res.write(line()), everyMs);
  open.count++;
  let stopped = false;
  const stop = () => {
    if (stopped) return;
    stopped = true;
    clearInterval(timer);
    open.count--;
  };
  req.socket.once('close', stop);
  res.once('close', stop);
}
