/**
 * The Kubernetes Service's credential to the API server (src/agent/kubecreds.ts, src/agent/kubeapi.ts), against
 * an HTTPS server that checks what a real API server checks first: a bearer token it currently accepts (it
 * rotates, as the kubelet rotates the projected token), or a client certificate from its CA. Requests go through
 * resourceConnector's stream, as the tunnel hands them from the Proxy.
 */
import { mkdirSync, mkdtempSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import http from 'node:http';
import type net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { inClusterCredentials, MAX_TOKEN_BYTES, resolveKubeconfig } from '../../src/agent/kubecreds.js';
import { resourceConnector } from '../../src/agent/resources.js';
import { parseConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { codeOf, failureOf } from '../helpers/errors.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';

let pki: TestPki;
let dir: string;
let api: https.Server;
let port: number;
/** The token the API server accepts now. */
let accepted = 'token-one';
/** What the API server saw of each request. */
const seen: Array<{ authorization: string | undefined; cn: string | undefined; impersonate: string | undefined }> = [];

beforeAll(async () => {
  pki = await makeTestPki();
  dir = mkdtempSync(join(tmpdir(), 'kubecreds-'));
  mkdirSync(join(dir, 'sa'));
  const cert = await pki.serverCert({ names: ['kube.test'], ips: ['127.0.0.1'] });
  api = https.createServer({ cert: cert.certPem, key: cert.keyPem, ca: pki.caPem, requestCert: true, rejectUnauthorized: false }, (req, res) => {
    const peer = (req.socket as TLSSocket).getPeerCertificate();
    const cn = (req.socket as TLSSocket).authorized ? (peer.subject?.CN as string | undefined) : undefined;
    seen.push({ authorization: req.headers.authorization, cn, impersonate: req.headers['impersonate-user'] as string | undefined });
    const ok = req.headers.authorization === `Bearer ${accepted}` || cn !== undefined;
    res.writeHead(ok ? 200 : 401, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ kind: ok ? 'NamespaceList' : 'Status', path: req.url }));
  });
  await new Promise<void>((r) => api.listen(0, '127.0.0.1', r));
  port = (api.address() as net.AddressInfo).port;
  writeFileSync(join(dir, 'sa', 'ca.crt'), pki.caPem);
  writeFileSync(join(dir, 'sa', 'token'), 'token-one\n');
});

afterAll(async () => {
  api.close();
  rmSync(dir, { recursive: true, force: true });
  await pki.cleanup();
});

function connector(cluster: string) {
  const config = parseConfig(['kube_service:', '  clusters:', `    - {name: c, api_server: "https://127.0.0.1:${port}", ${cluster}}`].join('\n'), 'kubecreds.test.yaml');
  return resourceConnector(config, ['kube_service'], new Dialer({ env: {} }), 'test');
}

/** One request over the stream the agent hands the tunnel, as the Proxy sends it. */
async function get(stream: Duplex, headers: Record<string, string> = {}): Promise<{ status: number; body: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const req = http.request({ path: '/api/v1/namespaces', headers: { ...headers, connection: 'close' }, createConnection: () => stream as never }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(Buffer.concat(chunks).toString()) as Record<string, unknown> }));
    });
    req.on('error', reject);
    req.end();
  });
}

const request = { service: 'kube' as const, resource: 'c', client_src: '127.0.0.1:1', client_dst: '127.0.0.1:2', user: 'alice' };

describe('in_cluster: the projected service-account token and CA', () => {
  it('sends the token as a bearer token, trusts ca.crt, and uses a rotated token on the next request', async () => {
    const connect = connector(`credentials: in_cluster, service_account_dir: ${join(dir, 'sa')}`);
    const first = await get(await connect(request), { 'impersonate-user': 'alice' });
    expect(first.status).toBe(200);
    expect(seen.at(-1)).toMatchObject({ authorization: 'Bearer token-one', impersonate: 'alice' });
    // The kubelet rotates the file; the API server stops accepting the old token.
    writeFileSync(join(dir, 'sa', 'token'), 'token-two-longer\n');
    accepted = 'token-two-longer';
    expect((await get(await connect(request))).status).toBe(200);
    expect(seen.at(-1)?.authorization).toBe('Bearer token-two-longer');
  });

  it('replaces an Authorization header on the stream with its own (a client never picks the credential)', async () => {
    const connect = connector(`credentials: in_cluster, service_account_dir: ${join(dir, 'sa')}`);
    await get(await connect(request), { authorization: 'Bearer stolen' });
    expect(seen.at(-1)?.authorization).toBe(`Bearer ${accepted}`);
  });

  it('after a 401 the token is read again even when the file looks unchanged', () => {
    const sa = join(dir, 'sa401');
    mkdirSync(sa);
    writeFileSync(join(sa, 'ca.crt'), pki.caPem);
    writeFileSync(join(sa, 'token'), 'aaaa');
    utimesSync(join(sa, 'token'), 1_000_000, 1_000_000);
    const creds = inClusterCredentials(sa, undefined);
    expect(creds.authorization()).toBe('Bearer aaaa');
    // Same inode, same size, same mtime (as within a coarse filesystem's tick): only the 401 tells.
    writeFileSync(join(sa, 'token'), 'bbbb');
    utimesSync(join(sa, 'token'), 1_000_000, 1_000_000);
    expect(creds.authorization()).toBe('Bearer aaaa');
    creds.rejected();
    expect(creds.authorization()).toBe('Bearer bbbb');
  });

  it('an oversized, empty or missing token answers GW_ERR_KUBE_CREDENTIALS and nothing reaches the API server', async () => {
    const sa = join(dir, 'bad');
    mkdirSync(sa);
    writeFileSync(join(sa, 'ca.crt'), pki.caPem);
    const connect = connector(`credentials: in_cluster, service_account_dir: ${sa}`);
    const before = seen.length;
    for (const token of ['x'.repeat(MAX_TOKEN_BYTES + 1), '  \n', undefined, 'two\nlines']) {
      if (token === undefined) rmSync(join(sa, 'token'), { force: true });
      else writeFileSync(join(sa, 'token'), token);
      const r = await get(await connect(request));
      expect(r.status).toBe(502);
      expect(r.body).toMatchObject({ error: { code: 'GW_ERR_KUBE_CREDENTIALS' } });
    }
    expect(seen.length).toBe(before);
  });
});

describe('hostile API servers behind the credential', () => {
  it('an API server that cannot be reached answers the request 502 with the code of the Dialer, not a hang', async () => {
    const config = parseConfig(['kube_service:', '  clusters:', `    - {name: c, api_server: "https://127.0.0.1:1", credentials: in_cluster, service_account_dir: ${join(dir, 'sa')}}`].join('\n'), 'x.yaml');
    const r = await get(await resourceConnector(config, ['kube_service'], new Dialer({ env: {} }), 'test', 2_000)(request));
    expect(r.status).toBe(502);
    expect(r.body).toMatchObject({ error: { code: 'GW_ERR_DIAL_UNREACHABLE' } });
  });

  it('an answer the API server cuts short is cut for the client too (never ended as if complete)', async () => {
    const cert = await pki.serverCert({ names: ['kube.test'], ips: ['127.0.0.1'] });
    const liar = https.createServer({ cert: cert.certPem, key: cert.keyPem }, (_req, res) => {
      res.writeHead(200, { 'content-length': '1000' });
      res.write('{"kind":"Pod');
      setImmediate(() => res.socket?.destroy());
    });
    await new Promise<void>((r) => liar.listen(0, '127.0.0.1', r));
    try {
      const liarPort = (liar.address() as net.AddressInfo).port;
      const config = parseConfig(['kube_service:', '  clusters:', `    - {name: c, api_server: "https://127.0.0.1:${liarPort}", credentials: in_cluster, service_account_dir: ${join(dir, 'sa')}}`].join('\n'), 'x.yaml');
      const stream = await resourceConnector(config, ['kube_service'], new Dialer({ env: {} }), 'test')(request);
      const outcome = await new Promise<string>((resolve) => {
        const req = http.request({ path: '/api/v1/pods', headers: { connection: 'close' }, createConnection: () => stream as never }, (res) => {
          res.on('data', () => undefined);
          res.on('end', () => resolve(res.complete ? 'complete' : 'cut'));
          res.on('error', () => resolve('cut'));
          res.on('aborted', () => resolve('cut'));
        });
        req.on('error', () => resolve('cut'));
        req.end();
      });
      expect(outcome).toBe('cut');
    } finally {
      liar.close();
    }
  });
});

describe('kubeconfig: a context’s token or client certificate', () => {
  function kubeconfig(name: string, user: Record<string, unknown>, extra: Record<string, unknown> = {}): string {
    const file = join(dir, name);
    const doc = {
      apiVersion: 'v1',
      kind: 'Config',
      'current-context': 'main',
      clusters: [{ name: 'k', cluster: { server: `https://127.0.0.1:${port}`, 'certificate-authority-data': Buffer.from(pki.caPem).toString('base64'), ...extra } }],
      users: [{ name: 'u', user }],
      contexts: [{ name: 'main', context: { cluster: 'k', user: 'u' } }],
    };
    writeFileSync(file, JSON.stringify(doc));
    return file;
  }

  it('a client certificate and key (files relative to the kubeconfig) in the TLS handshake', async () => {
    const client = await pki.clientCert({ cn: 'gateway-agent' });
    writeFileSync(join(dir, 'agent.crt'), client.certPem);
    writeFileSync(join(dir, 'agent.key'), client.keyPem);
    const file = kubeconfig('cert.yaml', { 'client-certificate': 'agent.crt', 'client-key': 'agent.key' });
    const r = await get(await connector(`credentials: kubeconfig, kubeconfig: ${file}`)(request));
    expect(r.status).toBe(200);
    expect(seen.at(-1)).toMatchObject({ cn: 'gateway-agent', authorization: undefined });
  });

  it('a token, and the CA from the cluster entry', async () => {
    const file = kubeconfig('token.yaml', { token: accepted });
    expect((await get(await connector(`credentials: kubeconfig, kubeconfig: ${file}`)(request))).status).toBe(200);
    expect(seen.at(-1)?.authorization).toBe(`Bearer ${accepted}`);
  });

  it('exec plugins, auth-provider, basic auth and insecure-skip-tls-verify are refused with GW_ERR_KUBE_AUTH_UNSUPPORTED before any request', async () => {
    const before = seen.length;
    const cases = [
      kubeconfig('exec.yaml', { exec: { apiVersion: 'client.authentication.k8s.io/v1', command: 'aws' } }),
      kubeconfig('provider.yaml', { 'auth-provider': { name: 'gcp' } }),
      kubeconfig('basic.yaml', { username: 'admin', password: 'x' }),
      kubeconfig('insecure.yaml', { token: accepted }, { 'insecure-skip-tls-verify': true }),
    ];
    for (const file of cases) {
      const r = await get(await connector(`credentials: kubeconfig, kubeconfig: ${file}`)(request));
      expect(r.body).toMatchObject({ error: { code: 'GW_ERR_KUBE_AUTH_UNSUPPORTED' } });
    }
    expect(seen.length).toBe(before);
  });

  it('a missing context, a user with nothing, or a file that is not YAML: GW_ERR_KUBE_CREDENTIALS naming the file', async () => {
    const empty = kubeconfig('empty.yaml', {});
    expect(await codeOf(() => resolveKubeconfig('{contexts: []}', '/k', 'nope'))).toBe('GW_ERR_KUBE_CREDENTIALS');
    expect(await codeOf(() => resolveKubeconfig(': : [', '/k', undefined))).toBe('GW_ERR_KUBE_CREDENTIALS');
    // Hostile: the parser's message would quote the broken line, token and all; the error reaches the user.
    const broken = await failureOf(async () => resolveKubeconfig('users:\n- name: u\n  user: {token: s3cr3t-t0ken\n', '/k', undefined));
    expect(broken.code).toBe('GW_ERR_KUBE_CREDENTIALS');
    expect(broken.message).not.toContain('s3cr3t');
    const r = await get(await connector(`credentials: kubeconfig, kubeconfig: ${empty}`)(request));
    expect(r.body).toMatchObject({ error: { code: 'GW_ERR_KUBE_CREDENTIALS' } });
    expect(String((r.body.error as { message: string }).message)).toContain(empty);
  });

  it('the configuration refuses credentials: kubeconfig without the file, and a kubeconfig that would be ignored', () => {
    expect(() => connector('credentials: kubeconfig')).toThrow(/names no kubeconfig/);
    expect(() => connector('kubeconfig: /etc/k')).toThrow(/would be ignored/);
  });
});
