/**
 * TLS-inspecting proxies, against a real one: squid-openssl with ssl_bump, minting certificates signed by a
 * corporate CA the test makes, in front of a TLS server that stands for the Proxy (its certificate issued by a
 * cluster host CA, with the role proxy). The lab is first proven with curl as the reference client (through the
 * bump with --cacert of the corporate root; refused without it), so that a failure below is the gateway's.
 *
 * Then: a gateway client through the bump fails with GW_ERR_TLS_INSPECTED naming the corporate CA, and nothing
 * reaches the server; with the operator's fix (ssl_bump splice for the Proxy's name) the very same call works;
 * an untrusted certificate on a direct dial, or a self-signed one behind a plain proxy, stays
 * GW_ERR_CLIENT_UNTRUSTED and says so; a forged CA with the cluster CA's own name is told apart by its
 * signature; a proxy that answers CONNECT and then stalls the handshake ends at its deadline. The probe
 * (`gateway dial-plan --probe`'s engine) reports each path.
 */
import { X509Certificate } from 'node:crypto';
import { execFile } from 'node:child_process';
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import https from 'node:https';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { caPin, generateAuthority, generateKeyPair, issueTlsCert, type CertAuthority } from '../../src/auth/pki.js';
import { ApiClient, fetchPinnedCas } from '../../src/client/api.js';
import type { Profile } from '../../src/client/profile.js';
import { openResource } from '../../src/client/resources.js';
import { Dialer } from '../../src/dial/dialer.js';
import { probeTls } from '../../src/dial/probe.js';
import { tlsVerifyError, UNTRUSTED_HINTS } from '../../src/dial/tlsverify.js';
import { GatewayError } from '../../src/errors.js';
import { connectTls } from '../../src/stream/tls.js';
import { fetchTarget } from '../../src/upgrade/client.js';
import { curl } from '../helpers/curl.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { failureOf } from '../helpers/errors.js';

const run = promisify(execFile);
const SERVER_IP = '127.0.0.21';
const NAME = 'proxy.gw.test';
const APP = 'app.gw.test';
const CORP_ROOT = 'CN=Corp Root CA, O=Example Corp';

let corp: TestPki;
let upstream: TestPki;
let cluster: CertAuthority;
let clusterServer: https.Server;
let appServer: https.Server;
let clusterPort: number;
let appPort: number;
let requests = 0;
let bump: Squid;
let splice: Squid;
let plain: Squid;
const cleanups: Array<() => Promise<unknown>> = [];

async function proxyCert(authority: CertAuthority, dns = [NAME]): Promise<{ key: string; cert: string }> {
  const keys = generateKeyPair();
  const cert = await issueTlsCert(authority, {
    publicKeyPem: keys.publicKeyPem,
    identity: { kind: 'host', name: 'proxy-1', cluster: authority.clusterName, roles: ['proxy'] },
    dnsNames: dns,
    ipAddresses: [SERVER_IP],
    ttlMs: 24 * 3600_000,
    usage: 'server',
  });
  return { key: keys.privateKeyPem, cert };
}

function listen(server: net.Server, host = SERVER_IP): Promise<number> {
  return new Promise((resolve) => server.listen(0, host, () => resolve((server.address() as net.AddressInfo).port)));
}

/** An https server that counts requests and answers JSON, for the cluster's "Proxy". */
function jsonServer(creds: { key: string; cert: string }): https.Server {
  return https.createServer(creds, (req, res) => {
    requests++;
    // The version server's two answers (text), for the upgraders' request; JSON for the rest.
    if (req.url?.endsWith('/version')) return void res.end('17.0.2\n');
    if (req.url?.endsWith('/critical')) return void res.end('no\n');
    res.setHeader('content-type', 'application/json');
    res.end('{"ok":true}');
  });
}

const failure = (call: () => Promise<unknown>): Promise<GatewayError> => failureOf(call);

const through = (proxy: Squid | string) => new Dialer({ env: { HTTPS_PROXY: typeof proxy === 'string' ? proxy : proxy.url } });
const api = (dialer: Dialer, port = clusterPort, host = NAME) => new ApiClient({ address: `${host}:${port}`, dialer, ca: cluster.tls.certPem, timeoutMs: 10_000 });

/** The agent tunnel's way: the Dialer, then TLS with the host CA and a client certificate, classified by tlsverify. */
async function tunnelHandshake(dialer: Dialer, port = clusterPort, handshakeTimeoutMs?: number) {
  const address = `${NAME}:${port}`;
  const raw = await dialer.dial(address);
  const client = await proxyCert(cluster, ['agent.gw.test']);
  return connectTls(raw, { host: NAME, ca: cluster.tls.certPem, cert: client.cert, key: client.key, ...(handshakeTimeoutMs ? { handshakeTimeoutMs } : {}) }).catch((err: Error) => {
    throw tlsVerifyError(err, { address, server: 'proxy', untrustedHint: UNTRUSTED_HINTS.clusterCa(address) }) ?? err;
  });
}

beforeAll(async () => {
  corp = await makeTestPki(undefined, { subject: '/CN=Corp Root CA/O=Example Corp' });
  upstream = await makeTestPki();
  cleanups.push(corp.cleanup, upstream.cleanup);
  cluster = await generateAuthority('host', 'inspect.example');
  clusterServer = jsonServer(await proxyCert(cluster));
  clusterPort = await listen(clusterServer);
  const app = await upstream.serverCert({ names: [APP], ips: [] });
  appServer = https.createServer({ key: app.keyPem, cert: app.certPem }, (_req, res) => res.end('hello from the app'));
  appPort = await listen(appServer);
  cleanups.push(() => new Promise((r) => clusterServer.close(r)), () => new Promise((r) => appServer.close(r)));
  // Squid, which runs as the user proxy, reads its hosts file from a directory anyone may enter.
  const shared = await mkdtemp(join(tmpdir(), 'gw-inspect-'));
  await chmod(shared, 0o755);
  cleanups.push(() => rm(shared, { recursive: true, force: true }));
  const hosts = join(shared, 'hosts');
  await writeFile(hosts, `${SERVER_IP} ${NAME} ${APP}\n`, { mode: 0o644 });
  // Squid trusts the app's CA and the cluster's for the servers behind it (an inspecting proxy must trust the
  // Proxy's certificate to reach it at all: a public CA's, or one its administrators added).
  const upstreamCas = join(shared, 'upstream-cas.pem');
  await writeFile(upstreamCas, `${await readFile(upstream.caCertPath, 'utf8')}\n${cluster.tls.certPem}`, { mode: 0o644 });
  const common = { bump: { caCert: corp.caCertPath, caKey: corp.caKeyPath, upstreamCa: upstreamCas } };
  bump = await startSquid({ ...common, extraConfig: [`hosts_file ${hosts}`, 'ssl_bump bump all'] });
  cleanups.push(bump.stop);
  // The operator's fix: inspection skipped for the Proxy's name, every other name still inspected.
  splice = await startSquid({ ...common, extraConfig: [`hosts_file ${hosts}`, `acl gateway_proxy ssl::server_name ${NAME}`, 'ssl_bump splice gateway_proxy', 'ssl_bump bump all'] });
  cleanups.push(splice.stop);
  plain = await startSquid({ extraConfig: [`hosts_file ${hosts}`] });
  cleanups.push(plain.stop);
}, 90_000);

afterAll(async () => {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
});

describe('the lab, proven with curl', () => {
  it('curl trusting the corporate root gets the page through the bump, and squid logs the decrypted request', async () => {
    const r = await curl(['--proxy', bump.url, '--cacert', corp.caCertPath, `https://${APP}:${appPort}/`]);
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe('hello from the app');
    // A bumped CONNECT shows the request inside it, which only an inspecting proxy can see.
    await bump.waitForAccessLog((l) => l.includes(`GET https://${APP}:${appPort}/`));
  });

  it('curl without the corporate root refuses the bumped certificate (exit 60)', async () => {
    const r = await curl(['--proxy', bump.url, '--cacert', upstream.caCertPath, `https://${APP}:${appPort}/`]);
    expect(r.status).toBe(60);
  });

  it('through the splicing squid, the Proxy name is not inspected (curl sees the cluster CA) but other names still are', async () => {
    const clusterCa = join(corp.dir, 'cluster-ca.pem');
    await writeFile(clusterCa, cluster.tls.certPem);
    const spliced = await curl(['--proxy', splice.url, '--cacert', clusterCa, `https://${NAME}:${clusterPort}/`]);
    expect(spliced.stderr).toBe('');
    expect(spliced.stdout).toBe('{"ok":true}');
    const bumped = await curl(['--proxy', splice.url, '--cacert', corp.caCertPath, `https://${APP}:${appPort}/`]);
    expect(bumped.stdout).toBe('hello from the app');
  });
});

describe('a gateway client behind the bumping squid', () => {
  it('the API client fails with GW_ERR_TLS_INSPECTED naming the corporate CA and the proxy; the server gets nothing', async () => {
    const before = requests;
    const err = await failure(() => api(through(bump)).call('GET', '/webapi/find'));
    expect(err.code).toBe('GW_ERR_TLS_INSPECTED');
    expect(err.message).toContain(`TLS to ${NAME}:${clusterPort} is inspected by ${CORP_ROOT}`);
    expect(err.message).toContain(`through the proxy ${bump.url} (from HTTPS_PROXY)`);
    // The certificate squid made carries the cluster's name: its issuer gives it away.
    expect(err.message).toContain(`certificate for CN=${NAME}`);
    expect(err.hint).toContain(`ssl::server_name ${NAME}`);
    expect(err.hint).toContain('ssl_bump splice');
    expect(err.hint).toContain(`NO_PROXY`);
    expect(err.details).toMatchObject({ root: CORP_ROOT, proxy: bump.url, variable: 'HTTPS_PROXY' });
    expect(requests).toBe(before);
  });

  it('the proxy password in HTTPS_PROXY is never in the message or its details', async () => {
    const withPassword = through(bump.url.replace('http://', 'http://alice:s3cret-pw@'));
    const err = await failure(() => api(withPassword).call('GET', '/webapi/find'));
    expect(err.code).toBe('GW_ERR_TLS_INSPECTED');
    expect(err.message).toContain(`through the proxy ${bump.url.replace('http://', 'http://alice:***@')}`);
    expect(JSON.stringify({ m: err.message, h: err.hint, d: err.details })).not.toContain('s3cret-pw');
  });

  it("the upgraders' version request: the same code, and since they take the operator's roots, the hint offers that too", async () => {
    const endpoint = { base: `https://${NAME}:${clusterPort}/webapi/updates/stable` } as Parameters<typeof fetchTarget>[0];
    const err = await failure(() => fetchTarget(endpoint, { dialer: through(bump), ca: [cluster.tls.certPem], timeoutMs: 10_000 }));
    expect(err.code).toBe('GW_ERR_TLS_INSPECTED');
    expect(err.hint).toContain('ssl_bump splice');
    expect(err.hint).toContain(`if ${CORP_ROOT} is your organisation's root, trust it`);
    expect(err.hint).toContain('GATEWAY_UPGRADE_CA_FILE');
  });

  it("the upgraders given the corporate root (GATEWAY_UPGRADE_CA_FILE) read the version through the bump: they need no client certificate, and what they install is checked by its signature or checksum", async () => {
    const endpoint = { base: `https://${NAME}:${clusterPort}/webapi/updates/stable` } as Parameters<typeof fetchTarget>[0];
    const before = requests;
    const target = await fetchTarget(endpoint, { dialer: through(bump), ca: [cluster.tls.certPem, await readFile(corp.caCertPath, 'utf8')], timeoutMs: 10_000 });
    expect(target).toMatchObject({ version: '17.0.2', critical: false });
    expect(requests).toBeGreaterThan(before);
    await bump.waitForAccessLog((l) => l.includes('/webapi/updates/stable/version'));
  });

  it("the tunnel's handshake (client certificate, host CA) fails the same way", async () => {
    const err = await failure(() => tunnelHandshake(through(bump)));
    expect(err.code).toBe('GW_ERR_TLS_INSPECTED');
    expect(err.message).toContain(`inspected by ${CORP_ROOT}`);
  });

  it("gwsh's resource connections (gwsh proxy app|db) fail the same way, before the route request is written", async () => {
    const client = await proxyCert(cluster, ['user.gw.test']);
    const profile = { hostCa: cluster.tls.certPem, cert: client.cert, key: client.key } as Profile;
    const err = await failure(() => openResource(profile, `${NAME}:${clusterPort}`, { alpn: 'gateway-tcp', resource: 'app1', kind: 'app' }, through(bump)));
    expect(err.code).toBe('GW_ERR_TLS_INSPECTED');
    expect(err.message).toContain(`inspected by ${CORP_ROOT}`);
  });

  it('with the splice exception the same calls succeed', async () => {
    expect(await api(through(splice)).call('GET', '/webapi/find')).toEqual({ ok: true });
    const socket = await tunnelHandshake(through(splice));
    expect(socket.authorized).toBe(true);
    socket.destroy();
  });
});

describe('not inspection', () => {
  it("the pinned CA fetch through a plain proxy: a Proxy's answer without CAs stays GW_ERR_API_BAD_RESPONSE (its chain holds the pinned CA), another cluster's stays GW_ERR_AUTH_PIN_MISMATCH", async () => {
    const creds = await proxyCert(cluster);
    const other = await generateAuthority('host', 'other.example');
    const answers = new Map<string, string>([['/webapi/ca', '{"ok":true}']]);
    const server = https.createServer({ key: creds.key, cert: `${creds.cert}${cluster.tls.certPem}` }, (req, res) => res.end(answers.get(req.url ?? '') ?? '{}'));
    const port = await listen(server);
    cleanups.push(() => new Promise((r) => server.close(r)));
    const noCas = await failure(() => fetchPinnedCas(`${NAME}:${port}`, caPin(cluster.tls.certPem), through(plain)));
    expect(noCas.code).toBe('GW_ERR_API_BAD_RESPONSE');
    answers.set('/webapi/ca', JSON.stringify({ host_ca: cluster.tls.certPem }));
    const wrongPin = await failure(() => fetchPinnedCas(`${NAME}:${port}`, caPin(other.tls.certPem), through(plain)));
    expect(wrongPin.code).toBe('GW_ERR_AUTH_PIN_MISMATCH');
  });

  it('a certificate of an unknown CA on a direct dial is GW_ERR_CLIENT_UNTRUSTED, naming its issuer and the direct path', async () => {
    const stranger = await makeTestPki(undefined, { subject: '/CN=Stranger CA' });
    cleanups.push(stranger.cleanup);
    const cert = await stranger.serverCert({ names: [NAME], ips: [SERVER_IP] });
    const server = https.createServer({ key: cert.keyPem, cert: cert.certPem }, (_q, res) => res.end('{}'));
    const port = await listen(server);
    cleanups.push(() => new Promise((r) => server.close(r)));
    const err = await failure(() => api(new Dialer({ env: {} }), port, SERVER_IP).call('GET', '/'));
    expect(err.code).toBe('GW_ERR_CLIENT_UNTRUSTED');
    expect(err.message).toContain('issued by CN=Stranger CA');
    expect(err.message).toContain('dialled directly, no proxy in the path');
  });

  it('a self-signed certificate behind a plain proxy is GW_ERR_CLIENT_UNTRUSTED: the proxy only tunnelled', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'gw-selfsigned-'));
    cleanups.push(() => rm(dir, { recursive: true, force: true }));
    const [keyPath, certPath] = [join(dir, 'key.pem'), join(dir, 'cert.pem')];
    await run('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes', '-keyout', keyPath, '-out', certPath, '-days', '1', '-subj', `/CN=${NAME}`, '-addext', `subjectAltName=DNS:${NAME}`]);
    const server = https.createServer({ key: await readFile(keyPath), cert: await readFile(certPath) }, (_q, res) => res.end('{}'));
    const port = await listen(server);
    cleanups.push(() => new Promise((r) => server.close(r)));
    const err = await failure(() => api(through(plain), port).call('GET', '/'));
    expect(err.code).toBe('GW_ERR_CLIENT_UNTRUSTED');
    expect(err.message).toContain(`self-signed by CN=${NAME}`);
    expect(err.message).toContain(`dialled through the proxy ${plain.url}`);
  });
});

describe('hostile paths', () => {
  it("a CA forged with the cluster CA's own name is refused, and the probe tells it from the cluster's by its signature", async () => {
    const subject = `/${new X509Certificate(cluster.tls.certPem).subject.split('\n').join('/')}`;
    const forged = await makeTestPki(undefined, { subject });
    cleanups.push(forged.cleanup);
    const cert = await forged.serverCert({ names: [NAME], ips: [SERVER_IP] });
    const server = https.createServer({ key: cert.keyPem, cert: cert.certPem }, (_q, res) => res.end('{}'));
    const port = await listen(server);
    cleanups.push(() => new Promise((r) => server.close(r)));
    const err = await failure(() => api(through(plain), port).call('GET', '/'));
    expect(err.code).toBe('GW_ERR_TLS_INSPECTED');
    const probe = await probeTls(through(plain), `${NAME}:${port}`, { clusterCas: [cluster.tls.certPem] });
    expect(probe.error).toBeUndefined();
    expect(probe.chain[0]!.issuer).toBe(new X509Certificate(cluster.tls.certPem).subject.split('\n').join(', '));
    expect(probe.verdict.cluster).toBe(false);
    expect(probe.verdict.inspectedBy).toBeDefined();
  });

  it('a proxy that answers CONNECT and then stalls the handshake: GW_ERR_TLS_HANDSHAKE_TIMEOUT, and the probe ends at its deadline', async () => {
    const sockets = new Set<net.Socket>();
    const staller = net.createServer((s) => {
      sockets.add(s);
      s.on('error', () => undefined);
      s.once('data', () => s.write('HTTP/1.1 200 Connection established\r\n\r\n'));
    });
    const port = await listen(staller, '127.0.0.22');
    cleanups.push(async () => {
      for (const s of sockets) s.destroy();
      await new Promise((r) => staller.close(r));
    });
    const dialer = through(`http://127.0.0.22:${port}`);
    const err = await failure(() => tunnelHandshake(dialer, clusterPort, 500));
    expect(err.code).toBe('GW_ERR_TLS_HANDSHAKE_TIMEOUT');
    expect(err.message).toContain(`TLS handshake with ${NAME}`);
    const probe = await probeTls(dialer, `${NAME}:${clusterPort}`, { timeoutMs: 500 });
    expect(probe.error?.code).toBe('GW_ERR_TLS_HANDSHAKE_TIMEOUT');
  });
});

describe('the probe', () => {
  it('through the bump: the minted certificate, "inspected by" the corporate CA', async () => {
    const p = await probeTls(through(bump), `${NAME}:${clusterPort}`, { clusterCas: [cluster.tls.certPem] });
    expect(p.error).toBeUndefined();
    expect(p.chain[0]!.subject).toContain(`CN=${NAME}`);
    expect(p.verdict).toEqual({ cluster: false, root: CORP_ROOT, inspectedBy: CORP_ROOT });
    expect(p.route?.proxy?.display).toBe(bump.url);
  });

  it("through the splice: the cluster's certificate", async () => {
    const p = await probeTls(through(splice), `${NAME}:${clusterPort}`, { clusterCas: [cluster.tls.certPem] });
    expect(p.verdict.cluster).toBe(true);
    expect(p.verdict.inspectedBy).toBeUndefined();
  });

  it('without a cluster CA it reports the certificate and does not judge it', async () => {
    const p = await probeTls(through(bump), `https://${NAME}:${clusterPort}/`);
    expect(p.address).toBe(`${NAME}:${clusterPort}`);
    expect(p.verdict).toEqual({ cluster: undefined, root: CORP_ROOT, inspectedBy: undefined });
  });
});
