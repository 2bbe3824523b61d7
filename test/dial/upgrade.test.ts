/**
 * The transport through TLS-inspecting proxies (src/dial/upgrade.ts, decided by src/dial/fallback.ts), against
 * real peers: the Proxy's front door started in-process (its certificate from a cluster host CA, with the role
 * proxy) behind squid-openssl bumping everything with a corporate CA the test makes. Squid trusts the cluster CA
 * upstream and forwards WebSocket upgrades (http_upgrade_request_protocols), as an inspecting proxy that allows
 * WebSockets does. The lab is first proven with curl trusting the corporate root.
 *
 * With the corporate root given (GATEWAY_PROXY_CA_FILE), the cluster's TLS (ALPN, client certificate, host CA)
 * runs inside the upgrade, end to end: 4 MiB each way byte-exact, the client certificate verified by the Proxy,
 * squid's log showing the CONNECT and the GET of the upgrade inside it. Without it, or with another root:
 * GW_ERR_TLS_INSPECTED whose hint names the root to give. Hostile: a server at the web address that is not a
 * gateway (200, 404), a bumping server that answers 101 and then garbage: each a clear error, nothing hangs.
 */
import { createHash, randomBytes } from 'node:crypto';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import https from 'node:https';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Duplex } from 'node:stream';
import type tls from 'node:tls';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { generateAuthority, generateKeyPair, issueTlsCert, type CertAuthority } from '../../src/auth/pki.js';
import { ApiClient, proxyServerIdentity } from '../../src/client/api.js';
import { parseConfig } from '../../src/config/index.js';
import { Dialer } from '../../src/dial/dialer.js';
import { connectClusterTls, forgetInspected } from '../../src/dial/fallback.js';
import { probeTls } from '../../src/dial/probe.js';
import { UNTRUSTED_HINTS } from '../../src/dial/tlsverify.js';
import { openUpgradeStream } from '../../src/dial/upgrade.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import type { ConnInfo } from '../../src/mux/multiplexer.js';
import { startFrontDoor, type FrontDoor } from '../../src/proxy/frontdoor.js';
import { VersionServer } from '../../src/proxy/versions.js';
import { connectTls } from '../../src/stream/tls.js';
import { VERSION } from '../../src/version.js';
import { UPGRADE_PATH, UPGRADE_TRANSPORT } from '../../src/wire/ping.js';
import { curl } from '../helpers/curl.js';
import { failureOf } from '../helpers/errors.js';
import { captureLogs } from '../helpers/logs.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';

setRootLogger(createLogger({ level: 'silent' }));

const PROXY_IP = '127.0.0.41';
const NAME = 'proxy.upgrade.test';
const FAKE = 'fake.upgrade.test';
const CORP_ROOT = 'CN=Corp Root CA, O=Example Corp';

let dir: string;
let corp: TestPki;
let other: TestPki;
let cluster: CertAuthority;
let door: FrontDoor;
let address: string;
let bump: Squid;
let fakeServer: https.Server;
let fakeAddress: string;
let fakeMode: 'ok200' | 'notfound' | 'garbage' | 'silent' = 'notfound';
const upgradedSockets = new Set<net.Socket>();
let client: { key: string; cert: string };
/** What the front door's services were handed (the tunnel's and the resources' TLS sockets). */
const served: Array<{ info: ConnInfo; authorized: boolean }> = [];
const cleanups: Array<() => Promise<unknown> | unknown> = [];

async function hostCert(names: string[], roles: string[], usage: 'server' | 'client'): Promise<{ key: string; cert: string }> {
  const keys = generateKeyPair();
  const cert = await issueTlsCert(cluster, {
    publicKeyPem: keys.publicKeyPem,
    identity: { kind: 'host', name: names[0]!, cluster: cluster.clusterName, roles },
    dnsNames: names,
    ipAddresses: usage === 'server' ? [PROXY_IP] : [],
    ttlMs: 24 * 3600_000,
    usage,
  });
  return { key: keys.privateKeyPem, cert };
}

/** An echo service that records whether the client certificate was verified. */
const echo = (stream: Duplex, info: ConnInfo) => {
  served.push({ info, authorized: (stream as tls.TLSSocket).authorized === true });
  stream.on('error', () => stream.destroy());
  stream.pipe(stream);
};

const through = (env: Record<string, string> = {}) => new Dialer({ env: { HTTPS_PROXY: bump.url, ...env } });
const withRoot = () => through({ GATEWAY_PROXY_CA_FILE: corp.caCertPath });
const innerTls = (alpn: string) => ({ ALPNProtocols: [alpn], ca: cluster.tls.certPem, cert: client.cert, key: client.key, host: NAME, checkServerIdentity: proxyServerIdentity });
const peer = { server: 'proxy' as const, untrustedHint: UNTRUSTED_HINTS.clusterCa(NAME) };

/** Writes `size` random bytes and reads as many back (the echo), comparing them. */
async function echoExact(socket: Duplex, size: number): Promise<boolean> {
  const payload = randomBytes(size);
  const chunks: Buffer[] = [];
  let got = 0;
  const back = new Promise<Buffer>((resolve, reject) => {
    socket.on('data', (c: Buffer) => {
      chunks.push(c);
      got += c.length;
      if (got >= size) resolve(Buffer.concat(chunks));
    });
    socket.once('close', () => reject(new Error(`closed after ${got} of ${size} bytes`)));
  });
  socket.write(payload);
  return (await back).equals(payload);
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-upgrade-'));
  await chmod(dir, 0o755);
  cleanups.push(() => rm(dir, { recursive: true, force: true }));
  corp = await makeTestPki(undefined, { subject: '/CN=Corp Root CA/O=Example Corp' });
  other = await makeTestPki(undefined, { subject: '/CN=Some Other Root' });
  cleanups.push(corp.cleanup, other.cleanup);
  cluster = await generateAuthority('host', 'upgrade.example');
  client = await hostCert(['agent-1'], ['node'], 'client');
  const proxy = await hostCert([NAME], ['proxy'], 'server');
  const config = parseConfig(
    ['gateway:', `  nodename: ${NAME}`, 'auth_service:', '  cluster_name: upgrade.example', 'proxy_service:', `  web_listen_addr: ${PROXY_IP}:0`, `  public_addr: ${NAME}:443`, ''].join('\n'),
    'upgrade.test.yaml',
  );
  door = await startFrontDoor({
    config,
    clusterName: 'upgrade.example',
    tls: { key: proxy.key, cert: proxy.cert, ca: [cluster.tls.certPem] },
    api: (req, res) => {
      req.resume();
      const authorized = (req.socket as tls.TLSSocket).authorized === true;
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ authorized }));
    },
    versions: new VersionServer({ channels: config.proxy_service.automatic_upgrades_channels, ownVersion: VERSION, dialer: new Dialer({ env: {} }) }),
    services: { resource: echo, tunnel: echo },
    webRoot: dir,
  });
  cleanups.push(() => door.close());
  const port = Number(/:(\d+)$/.exec(door.addresses.web!)![1]);
  address = `${NAME}:${port}`;

  // A server at a web address that is not a gateway's: a certificate from the corporate CA, as a bump would show.
  const fake = await corp.serverCert({ names: [FAKE], ips: [] });
  fakeServer = https.createServer({ key: fake.keyPem, cert: fake.certPem }, (_req, res) => {
    if (fakeMode === 'ok200') res.writeHead(200, { 'content-type': 'text/html' }).end('<html>welcome</html>');
    else res.writeHead(404).end('not found');
  });
  // The bumping proxy that lies: a 101 that names our subprotocol, then bytes that are no WebSocket frame.
  fakeServer.on('upgrade', (req, socket: net.Socket) => {
    upgradedSockets.add(socket);
    if (fakeMode === 'silent') return; // takes the upgrade request and never answers
    if (fakeMode !== 'garbage') {
      socket.end(fakeMode === 'ok200' ? 'HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 20\r\n\r\n<html>welcome</html>' : 'HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n');
      return;
    }
    const accept = (req.headers['sec-websocket-key'] as string) + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';
    const hash = createHash('sha1').update(accept).digest('base64');
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: ${hash}\r\nsec-websocket-protocol: ${UPGRADE_TRANSPORT}\r\n\r\n`);
    socket.write(Buffer.from('\xff\xff\xff\xffgarbage that is not a frame'.repeat(4), 'latin1'));
  });
  await new Promise<void>((resolve) => fakeServer.listen(0, '127.0.0.42', resolve));
  fakeAddress = `${FAKE}:${(fakeServer.address() as net.AddressInfo).port}`;
  cleanups.push(() => {
    for (const s of upgradedSockets) s.destroy();
    fakeServer.closeAllConnections();
    return new Promise((r) => fakeServer.close(r));
  });

  const hosts = join(dir, 'hosts');
  await writeFile(hosts, `${PROXY_IP} ${NAME}\n127.0.0.42 ${FAKE}\n`, { mode: 0o644 });
  const upstreamCa = join(dir, 'upstream-ca.pem');
  // squid verifies what it connects to: the cluster CA for the Proxy, the corporate CA for the fake server.
  await writeFile(upstreamCa, `${cluster.tls.certPem}\n${corp.caPem}`, { mode: 0o644 });
  bump = await startSquid({
    bump: { caCert: corp.caCertPath, caKey: corp.caKeyPath, upstreamCa },
    extraConfig: [`hosts_file ${hosts}`, 'ssl_bump bump all', 'http_upgrade_request_protocols websocket allow all'],
  });
  cleanups.push(bump.stop);
}, 90_000);

afterAll(async () => {
  for (const c of cleanups.reverse()) await Promise.resolve(c()).catch(() => undefined);
}, 30_000);

beforeEach(() => forgetInspected());

describe('the lab, proven with curl', () => {
  it('curl trusting the corporate root reaches the Proxy through the bump, and squid logs the decrypted request', async () => {
    const r = await curl(['--proxy', bump.url, '--cacert', corp.caCertPath, `https://${address}/v1/anything`]);
    expect(r.stderr).toBe('');
    expect(JSON.parse(r.stdout)).toEqual({ authorized: false });
    await bump.waitForAccessLog((l) => l.includes(`GET https://${address}/v1/anything`));
  });
});

describe('with the corporate root given', () => {
  it("the cluster's TLS runs inside the upgrade: client certificate verified by the Proxy, 4 MiB each way byte-exact, squid saw the CONNECT and the upgrade", async () => {
    const mark = served.length;
    const socket = await connectClusterTls(withRoot(), address, innerTls('gateway-tcp'), { peer, clusterCa: cluster.tls.certPem });
    expect(socket.authorized).toBe(true);
    expect(socket.alpnProtocol).toBe('gateway-tcp');
    expect(await echoExact(socket, 4 * 1024 * 1024)).toBe(true);
    socket.destroy();
    expect(served.slice(mark)).toEqual([expect.objectContaining({ authorized: true, info: expect.objectContaining({ route: 'gateway-tcp', upgraded: true }) })]);
    await bump.waitForAccessLog((l) => l.includes(`GET https://${address}${UPGRADE_PATH}`));
    await bump.waitForAccessLog((l) => l.includes(`CONNECT ${address}`));
  });

  it('the reverse tunnel ALPN goes to the tunnel route, and the API client (mutual TLS, cluster CA) gets its answer', async () => {
    const mark = served.length;
    const tunnel = await connectClusterTls(withRoot(), address, innerTls('gateway-reversetunnel-v2'), { peer, clusterCa: cluster.tls.certPem });
    expect(await echoExact(tunnel, 64 * 1024)).toBe(true);
    tunnel.destroy();
    expect(served.slice(mark).map((s) => s.info.route)).toEqual(['gateway-reversetunnel']);
    const api = new ApiClient({ address, dialer: withRoot(), ca: cluster.tls.certPem, cert: client.cert, key: client.key, timeoutMs: 10_000 });
    expect(await api.call('GET', '/v1/anything')).toEqual({ authorized: true });
  });

  it('says why once, in the log, naming the inspecting CA and the proxy without its password', async () => {
    const lines = captureLogs();
    try {
      const dialer = new Dialer({ env: { HTTPS_PROXY: bump.url.replace('http://', 'http://alice:s3cret-pw@'), GATEWAY_PROXY_CA_FILE: corp.caCertPath } });
      const first = await connectClusterTls(dialer, address, innerTls('gateway-tcp'), { peer, clusterCa: cluster.tls.certPem });
      const second = await connectClusterTls(dialer, address, innerTls('gateway-tcp'), { peer, clusterCa: cluster.tls.certPem });
      first.destroy();
      second.destroy();
    } finally {
      setRootLogger(createLogger({ level: 'silent' }));
    }
    const why = lines.filter((l) => l.includes('whose root the operator gave'));
    expect(why).toHaveLength(1);
    expect(why[0]).toContain(`inspected by ${CORP_ROOT}`);
    expect(why[0]).toContain('alice:***@');
    expect(lines.join('')).not.toContain('s3cret-pw');
  });

  it('dial-plan --probe says the upgrade would be used; without the root, that the root is to be given', async () => {
    const given = await probeTls(withRoot(), address, { clusterCas: [cluster.tls.certPem] });
    expect(given.verdict.inspectedBy).toBe(CORP_ROOT);
    expect(given.upgradeTrusted).toBe(true);
    const missing = await probeTls(through(), address, { clusterCas: [cluster.tls.certPem] });
    expect(missing.verdict.inspectedBy).toBe(CORP_ROOT);
    expect(missing.upgradeTrusted).toBe(false);
  });
});

describe('without the root', () => {
  it('GW_ERR_TLS_INSPECTED, the hint naming the corporate root and where to give it; nothing reached the service', async () => {
    const mark = served.length;
    const err = await failureOf(() => connectClusterTls(through(), address, innerTls('gateway-tcp'), { peer, clusterCa: cluster.tls.certPem }));
    expect(err.code).toBe('GW_ERR_TLS_INSPECTED');
    expect(err.message).toContain(`inspected by ${CORP_ROOT}`);
    expect(err.hint).toContain(`root certificate of ${CORP_ROOT}`);
    expect(err.hint).toContain('GATEWAY_PROXY_CA_FILE');
    expect(served.length).toBe(mark);
  });

  it("another root given is not the inspecting proxy's: GW_ERR_TLS_INSPECTED as well", async () => {
    const err = await failureOf(() => connectClusterTls(through({ GATEWAY_PROXY_CA_FILE: other.caCertPath }), address, innerTls('gateway-tcp'), { peer }));
    expect(err.code).toBe('GW_ERR_TLS_INSPECTED');
  });

  it('openUpgradeStream itself refuses the outer certificate and names the root to give', async () => {
    const err = await failureOf(() => openUpgradeStream(through({ GATEWAY_PROXY_CA_FILE: other.caCertPath }), address, { clusterCa: cluster.tls.certPem }));
    expect(err.code).toBe('GW_ERR_TLS_INSPECTED');
    expect(err.hint).toContain(`if ${CORP_ROOT} is your organisation's root`);
    expect(err.hint).toContain('GATEWAY_PROXY_CA_FILE');
  });

  it('a root file that cannot be read is GW_ERR_DIAL_UPGRADE_ROOTS naming it', async () => {
    const err = await failureOf(() => openUpgradeStream(through({ GATEWAY_PROXY_CA_FILE: join(dir, 'missing.pem') }), address));
    expect(err.code).toBe('GW_ERR_DIAL_UPGRADE_ROOTS');
    expect(err.message).toContain('missing.pem');
  });
});

describe('hostile: what answers at the web address', () => {
  it('a server that is not a gateway (404, or 200 with a page) refuses the upgrade: GW_ERR_DIAL_UPGRADE_REFUSED with the status', async () => {
    fakeMode = 'notfound';
    const notFound = await failureOf(() => openUpgradeStream(withRoot(), fakeAddress));
    expect(notFound.code).toBe('GW_ERR_DIAL_UPGRADE_REFUSED');
    expect(notFound.details).toMatchObject({ status: 404 });
    fakeMode = 'ok200';
    const ok = await failureOf(() => openUpgradeStream(withRoot(), fakeAddress));
    expect(ok.code).toBe('GW_ERR_DIAL_UPGRADE_REFUSED');
    expect(ok.details).toMatchObject({ status: 200 });
  });

  it('a server that takes the upgrade request and never answers: GW_ERR_DIAL_UPGRADE_TIMEOUT at the deadline given', async () => {
    fakeMode = 'silent';
    const err = await failureOf(() => openUpgradeStream(withRoot(), fakeAddress, { timeoutMs: 1500 }));
    expect(err.code).toBe('GW_ERR_DIAL_UPGRADE_TIMEOUT');
  });

  it('a bumping server that answers 101 and then garbage: the inner TLS fails, nothing hangs', async () => {
    fakeMode = 'garbage';
    let stream: Duplex | undefined;
    const outcome = await openUpgradeStream(withRoot(), fakeAddress)
      .then((s) => connectTls((stream = s), { ...innerTls('gateway-tcp'), host: FAKE }))
      .then(() => 'connected', (err: unknown) => err);
    expect(outcome).toBeInstanceOf(Error);
    // Past the 101 (the upgrade was taken), the garbage broke the stream under the inner TLS.
    expect(stream).toBeDefined();
    expect(stream!.destroyed).toBe(true);
  });
});
