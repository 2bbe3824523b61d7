/**
 * Upgrades through the agent's Kubernetes credential front (src/agent/kubeapi.ts kubeFront): the stream the
 * tunnel hands it is written here as the Proxy writes it (an upgrade request head), against the smallest HTTPS
 * server that checks a bearer token and answers upgrades (not a real API server: part K2a's stand-in,
 * test/helpers/kubeapiserver.ts, is written in parallel). The Proxy's side is test/e2e/kube-upgrades.test.ts.
 */
import { mkdirSync, mkdtempSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import type http from 'node:http';
import type net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { kubeFront } from '../../src/agent/kubeapi.js';
import { inClusterCredentials, type KubeTls } from '../../src/agent/kubecreds.js';
import { GatewayError } from '../../src/errors.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';

let pki: TestPki;
let dir: string;
let api: https.Server;
let port: number;
let accepted = 'token-one';
const seen: Array<{ path: string; authorization?: string; upgrade?: string; impersonate?: string }> = [];
const held = new Set<Duplex>();

beforeAll(async () => {
  pki = await makeTestPki();
  dir = mkdtempSync(join(tmpdir(), 'kubeupgrade-'));
  const cert = await pki.serverCert({ names: ['kube.test'], ips: ['127.0.0.1'] });
  api = https.createServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
    seen.push({ path: req.url ?? '', authorization: req.headers.authorization });
    res.writeHead(req.headers.authorization === `Bearer ${accepted}` ? 200 : 401, { 'content-type': 'application/json' });
    res.end('{}');
  });
  api.on('upgrade', (req: http.IncomingMessage, socket: Duplex) => {
    held.add(socket);
    socket.on('error', () => undefined);
    socket.once('close', () => held.delete(socket));
    seen.push({ path: req.url ?? '', authorization: req.headers.authorization, upgrade: req.headers.upgrade, impersonate: req.headers['impersonate-user'] as string });
    if (req.headers.authorization !== `Bearer ${accepted}`) return void socket.end('HTTP/1.1 401 Unauthorized\r\ncontent-length: 12\r\n\r\nunauthorized');
    if (req.url === '/silent') return;
    socket.write('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n');
    socket.pipe(socket);
  });
  await new Promise<void>((r) => api.listen(0, '127.0.0.1', r));
  port = (api.address() as net.AddressInfo).port;
});

afterAll(() => {
  for (const s of held) s.destroy();
  api.close();
  rmSync(dir, { recursive: true, force: true });
  return pki.cleanup();
});

function serviceAccount(name: string, token: string | undefined): string {
  const sa = join(dir, name);
  mkdirSync(sa, { recursive: true });
  writeFileSync(join(sa, 'ca.crt'), pki.caPem);
  if (token !== undefined) writeFileSync(join(sa, 'token'), token);
  return sa;
}

const connectApi = (t: KubeTls): Promise<Duplex> =>
  new Promise((resolve, reject) => {
    const s = tls.connect({ host: '127.0.0.1', port, ca: t.ca, servername: 'kube.test' }, () => resolve(s));
    s.once('error', reject);
  });

/** Writes an upgrade request head on the front's stream, as the Proxy does; resolves with the answer's head and what follows. */
function upgradeThrough(front: Duplex, path: string, extra: string[] = []): Promise<{ head: string; rest: () => string; ended: Promise<unknown> }> {
  const ended = new Promise((r) => front.once('end', r));
  return new Promise((resolve) => {
    let buf = '';
    front.on('data', (c: Buffer) => {
      buf += c.toString();
      const end = buf.indexOf('\r\n\r\n');
      if (end >= 0) resolve({ head: buf.slice(0, end), rest: () => buf.slice(buf.indexOf('\r\n\r\n') + 4), ended });
    });
    front.write([`POST ${path} HTTP/1.1`, 'Host: kube', 'Connection: Upgrade', 'Upgrade: SPDY/3.1', 'X-Stream-Protocol-Version: v4.channel.k8s.io', 'Impersonate-User: alice', 'Authorization: Bearer stolen', ...extra, '', ''].join('\r\n'));
  });
}

describe("upgrades through the agent's credential front", () => {
  it("sends the upgrade with the agent's token (never the stream's), its Upgrade and the Proxy's Impersonate-User; relays the 101, then the bytes both ways", async () => {
    const front = kubeFront(inClusterCredentials(serviceAccount('ok', 'token-one'), undefined), connectApi);
    const { head, rest } = await upgradeThrough(front, '/api/v1/namespaces/d/pods/p/portforward');
    expect(head).toMatch(/^HTTP\/1\.1 101 /);
    expect(head).toMatch(/X-Stream-Protocol-Version: v4\.channel\.k8s\.io/);
    expect(seen.at(-1)).toMatchObject({ authorization: 'Bearer token-one', upgrade: 'SPDY/3.1', impersonate: 'alice' });
    front.write('frames');
    await new Promise<void>((r) => {
      const check = () => (rest().includes('frames') ? r() : setTimeout(check, 10));
      check();
    });
    front.destroy();
  });

  it('a 401 to an upgrade is relayed as it is, and the next request reads the token again though its file looks unchanged', async () => {
    const sa = serviceAccount('rotated', 'aaaa');
    utimesSync(join(sa, 'token'), 1_000_000, 1_000_000);
    accepted = 'aaaa';
    const creds = inClusterCredentials(sa, undefined);
    expect(creds.authorization()).toBe('Bearer aaaa');
    // Rotated in place: same inode, size and mtime; the API server takes only the new one.
    writeFileSync(join(sa, 'token'), 'bbbb');
    utimesSync(join(sa, 'token'), 1_000_000, 1_000_000);
    accepted = 'bbbb';
    try {
      const refused = await upgradeThrough(kubeFront(creds, connectApi), '/exec');
      expect(refused.head).toMatch(/^HTTP\/1\.1 401 /);
      expect(seen.at(-1)?.authorization).toBe('Bearer aaaa');
      const again = await upgradeThrough(kubeFront(creds, connectApi), '/exec');
      expect(again.head).toMatch(/^HTTP\/1\.1 101 /);
      expect(seen.at(-1)?.authorization).toBe('Bearer bbbb');
    } finally {
      accepted = 'token-one';
    }
  });

  it('hostile: an API server that never answers the upgrade: 504 GW_ERR_KUBE_UPGRADE_TIMEOUT at the deadline', async () => {
    const front = kubeFront(inClusterCredentials(serviceAccount('silent', 'token-one'), undefined), connectApi, { upgradeAnswerMs: 300 });
    const { head, rest, ended } = await upgradeThrough(front, '/silent');
    expect(head).toMatch(/^HTTP\/1\.1 504 /);
    await ended;
    expect(JSON.parse(rest())).toMatchObject({ error: { code: 'GW_ERR_KUBE_UPGRADE_TIMEOUT' } });
  });

  it('an API server that cannot be reached: the dial error with its own code; a credential that cannot be read: GW_ERR_KUBE_CREDENTIALS, nothing dialled', async () => {
    const unreachable = kubeFront(inClusterCredentials(serviceAccount('u', 'token-one'), undefined), () => Promise.reject(new GatewayError('GW_ERR_DIAL_UNREACHABLE', 'no route')));
    const a = await upgradeThrough(unreachable, '/exec');
    expect(a.head).toMatch(/^HTTP\/1\.1 502 /);
    await a.ended;
    expect(JSON.parse(a.rest())).toMatchObject({ error: { code: 'GW_ERR_DIAL_UNREACHABLE' } });
    let dialled = false;
    const noToken = kubeFront(inClusterCredentials(serviceAccount('none', undefined), undefined), (t) => {
      dialled = true;
      return connectApi(t);
    });
    const b = await upgradeThrough(noToken, '/exec');
    expect(b.head).toMatch(/^HTTP\/1\.1 502 /);
    await b.ended;
    expect(JSON.parse(b.rest())).toMatchObject({ error: { code: 'GW_ERR_KUBE_CREDENTIALS' } });
    expect(dialled).toBe(false);
  });
});
