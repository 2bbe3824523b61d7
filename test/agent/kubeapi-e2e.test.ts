/**
 * The agent's Kubernetes front on an end-to-end stream (src/agent/kubeapi.ts kubeFront with `e2e`): the stream is the
 * user's kubectl, not the Proxy, so the agent takes the /k8s/<cluster> prefix off and sets the impersonation from
 * the grant itself, plain requests and upgrades alike; a classic stream's Impersonate-* (the Proxy's) pass as they
 * came. The API server here is a plain HTTP server that records what reaches it (what a real one does with the
 * headers is test/e2e/kube-e2e.test.ts's, against the stand-in).
 */
import http from 'node:http';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { kubeFront, type KubeE2E } from '../../src/agent/kubeapi.js';
import type { KubeCredentials } from '../../src/agent/kubecreds.js';

interface Seen {
  path: string;
  headers: http.IncomingHttpHeaders;
  upgrade: boolean;
}

let api: http.Server;
let port: number;
const seen: Seen[] = [];
let dials = 0;
const held = new Set<Duplex>();

beforeAll(async () => {
  api = http.createServer((req, res) => {
    seen.push({ path: req.url ?? '', headers: req.headers, upgrade: false });
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end('{"kind":"PodList"}');
  });
  api.on('upgrade', (req: http.IncomingMessage, socket: Duplex) => {
    held.add(socket);
    socket.on('error', () => undefined);
    seen.push({ path: req.url ?? '', headers: req.headers, upgrade: true });
    socket.end('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n');
  });
  await new Promise<void>((r) => api.listen(0, '127.0.0.1', r));
  port = (api.address() as net.AddressInfo).port;
});

afterAll(() => {
  for (const s of held) s.destroy();
  api.close();
});

const creds: KubeCredentials = { tls: () => ({}), authorization: () => 'Bearer agent-token', rejected: () => undefined };
const connect = (): Promise<Duplex> => {
  dials++;
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1', () => resolve(s));
    s.once('error', reject);
  });
};
const E2E: KubeE2E = { cluster: 'dev', user: 'alice', access: { users: ['alice-k8s'], groups: ['devs'] } };

/** One request head through a new front; resolves with the answer's text once the front ends it. */
function through(head: string, e2e?: KubeE2E): Promise<string> {
  const front = kubeFront(creds, connect, e2e ? { e2e } : {});
  return new Promise((resolve) => {
    let out = '';
    front.on('data', (c: Buffer) => {
      out += c.toString();
      // An upgrade's 101 (or refusal) ends the exchange for this test.
      if (/^HTTP\/1\.1 (101|4\d\d)/.test(out) && out.includes('\r\n\r\n')) setTimeout(() => resolve(out), 20);
    });
    front.on('end', () => resolve(out));
    front.write(head);
  });
}

describe('an end-to-end kube stream at the agent', () => {
  it("a plain request: the prefix off, the client's Impersonate-* replaced by the grant's, the agent's credential", async () => {
    const n = seen.length;
    const answer = await through('GET /k8s/dev/api/v1/pods?limit=1 HTTP/1.1\r\nHost: 127.0.0.1\r\nImpersonate-User: alice-k8s\r\nImpersonate-Uid: 0\r\nImpersonate-Extra-Scopes: all\r\nAuthorization: Bearer client\r\nConnection: close\r\n\r\n', E2E);
    expect(answer).toMatch(/^HTTP\/1\.1 200/);
    const got = seen[n]!;
    expect(got.path).toBe('/api/v1/pods?limit=1');
    expect(got.headers).toMatchObject({ 'impersonate-user': 'alice-k8s', 'impersonate-group': 'devs', authorization: 'Bearer agent-token' });
    expect(Object.keys(got.headers).filter((h) => h.startsWith('impersonate-')).sort()).toEqual(['impersonate-group', 'impersonate-user']);
  });

  it('an upgrade asking for system:admin: a 403 Status before anything is dialled', async () => {
    const [n, d] = [seen.length, dials];
    const answer = await through('POST /k8s/dev/api/v1/namespaces/default/pods/web/exec?command=id HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nImpersonate-User: system:admin\r\n\r\n', E2E);
    expect(answer).toMatch(/^HTTP\/1\.1 403/);
    expect(answer).toContain('"reason":"Forbidden"');
    expect(answer).toContain('GW_ERR_KUBE_NO_IMPERSONATION: your roles do not allow acting as the Kubernetes user \\"system:admin\\"');
    expect([seen.length, dials]).toEqual([n, d]);
  });

  it("an upgrade within the grant: relayed with the grant's impersonation, the prefix off", async () => {
    const n = seen.length;
    const answer = await through('POST /k8s/dev/api/v1/namespaces/default/pods/web/exec?command=id HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nImpersonate-Group: devs\r\nImpersonate-Uid: 0\r\n\r\n', E2E);
    expect(answer).toMatch(/^HTTP\/1\.1 101/);
    expect(seen[n]).toMatchObject({ upgrade: true, path: '/api/v1/namespaces/default/pods/web/exec?command=id', headers: { 'impersonate-user': 'alice-k8s', 'impersonate-group': 'devs' } });
    expect(seen[n]!.headers).not.toHaveProperty('impersonate-uid');
  });

  it('a classic stream (no e2e): the path and the Proxy\'s Impersonate-* pass as they came', async () => {
    const n = seen.length;
    await through('GET /api/v1/pods HTTP/1.1\r\nHost: x\r\nImpersonate-User: someone\r\nConnection: close\r\n\r\n');
    expect(seen[n]).toMatchObject({ path: '/api/v1/pods', headers: { 'impersonate-user': 'someone' } });
  });
});
