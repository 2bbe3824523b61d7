/**
 * Who may tell the upgraders what to install (docs/security.md, "How each party checks that it talks to a Proxy").
 * The upgraders trust the agent's host CA besides the system's and the operator's CAs, and every host of the
 * cluster (an agent too) has a certificate of that CA that may hold the Proxy's name. So a version server whose
 * certificate bears the gateway identity must be a Proxy's: a rogue server holding a real agent's certificate under
 * the Proxy's name, naming a release that is published (with its checksum) at the download location, is refused
 * with GW_ERR_TLS_WRONG_ROLE and nothing is asked of it or installed. A real Proxy's certificate, and one from a CA
 * outside the cluster (the openssl test CA, standing for a public CA or GATEWAY_UPGRADE_CA_FILE), still work.
 * The release download location is never a member: a server there with an agent's certificate is refused too.
 * gateway-upgrade is the built CLI (tarball path, release server in process); the Kubernetes updater's channel
 * client is called in process.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { bearsIdentity } from '../../src/auth/pki.js';
import { Dialer } from '../../src/dial/dialer.js';
import { GatewayError } from '../../src/errors.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { VersionServer } from '../../src/proxy/versions.js';
import { download } from '../../src/upgrade/download.js';
import { channelVersionSource } from '../../src/upgrade/kube/controller.js';
import { writeSchedule } from '../../src/upgrade/schedule.js';
import { runCli } from '../helpers/gateway.js';
import { makeClusterPki, type ClusterPki, type IssuedCert } from '../helpers/members.js';
import { startHttpsServer, type HttpTestServer } from '../helpers/servers.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { fakeGatewayScript, makeTarball, startReleaseServer, tarballUpgradeEnv, writeScript } from './helpers.js';

setRootLogger(createLogger({ level: 'silent' }));

const HOST = '127.0.0.1';
const PROXY_NAME = 'proxy.gw.test';

interface VersionHost {
  server: HttpTestServer;
  /** Every path asked, in order. */
  requests: string[];
}

let dir: string;
let pki: TestPki;
let cluster: ClusterPki;
let agentCert: IssuedCert;
let proxyCert: IssuedCert;
let rogue: VersionHost;
let proxy: VersionHost;
let publicProxy: VersionHost;
let cdn: HttpTestServer;
const cdnRequests: string[] = [];
let rogueCdn: HttpTestServer;
const rogueCdnRequests: string[] = [];
let proxyCdn: HttpTestServer;
const proxyCdnRequests: string[] = [];
let root: string;
let bin: string;
let etc: string;
let restartLog: string;
let env: Record<string, string>;

/** A version server (every channel: 17.0.2) and a ping (cluster 17.0.2) over https with this certificate. */
async function startVersionHost(cert: IssuedCert): Promise<VersionHost> {
  const requests: string[] = [];
  const vs = new VersionServer({ ownVersion: '17.0.2', channels: {}, dialer: new Dialer({ env: {} }) });
  const server = await startHttpsServer({ cert: cert.certPem, key: cert.keyPem }, (req: IncomingMessage, res: ServerResponse) => {
    requests.push(req.url ?? '');
    if (vs.handle(req, res)) return;
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ server_version: '17.0.2' }));
  });
  return { server, requests };
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-upgrade-identity-'));
  await chmod(dir, 0o755);
  pki = await makeTestPki();
  cluster = await makeClusterPki('upgrade.example');
  // A real agent's certificate: a node that joined with the Proxy's name and address among its public addresses.
  agentCert = await cluster.issue({ name: 'agent-host-id', roles: ['node'], dns: [PROXY_NAME], ips: [HOST] });
  proxyCert = await cluster.issue({ name: 'proxy-host-id', roles: ['proxy'], dns: [PROXY_NAME], ips: [HOST] });
  rogue = await startVersionHost(agentCert);
  proxy = await startVersionHost(proxyCert);
  const outside = await pki.serverCert({ names: [PROXY_NAME], ips: [HOST] });
  publicProxy = await startVersionHost(outside);

  const release = await makeTarball('17.0.2', 'amd64');
  const files = new Map<string, Buffer | string>([
    [`/${release.name}`, release.body],
    [`/${release.name}.sha256`, `${release.sha256}  ${release.name}\n`],
  ]);
  // The real download server redirects /moved to the rogue one (a CDN's redirect, or one an attacker placed).
  const special = new Map([['/moved', (res: ServerResponse) => {
    res.writeHead(302, { location: `https://${HOST}:${rogueCdn.port}/${release.name}` });
    res.end();
  }]]);
  cdn = await startReleaseServer(pki, 'cdn.gw.test', HOST, { files, requests: cdnRequests, special });
  // The same release (and checksum) from a server holding the agent's certificate: what it serves would be run.
  rogueCdn = await startHttpsServer({ cert: agentCert.certPem, key: agentCert.keyPem }, (req, res) => {
    rogueCdnRequests.push(req.url ?? '');
    const body = files.get(req.url ?? '');
    res.writeHead(body === undefined ? 404 : 200);
    res.end(body);
  });
  // The same release from a Proxy's artifact route (src/proxy/artifacts.ts): a member, but a Proxy.
  proxyCdn = await startHttpsServer({ cert: proxyCert.certPem, key: proxyCert.keyPem }, (req, res) => {
    proxyCdnRequests.push(req.url ?? '');
    const body = files.get((req.url ?? '').replace('/v1/webapi/autoupdate/artifacts', ''));
    res.writeHead(body === undefined ? 404 : 200);
    res.end(body);
  });

  root = join(dir, 'root');
  bin = join(root, 'usr/local/bin');
  etc = join(root, 'etc/gateway-upgrade.d');
  await mkdir(bin, { recursive: true });
  await mkdir(etc, { recursive: true });
  // The agent's stored cluster CA, which the upgrader trusts as it finds it (<data_dir>/host/host-ca.pem).
  const dataDir = join(dir, 'var-lib-gateway');
  await mkdir(join(dataDir, 'host'), { recursive: true });
  await writeFile(join(dataDir, 'host', 'host-ca.pem'), cluster.caPem);
  restartLog = join(dir, 'restarts.log');
  const restart = await writeScript(join(dir, 'restart.sh'), `echo "restart $(${bin}/gateway --version)" >> ${restartLog}`);
  env = {
    ...tarballUpgradeEnv({
      root,
      bin,
      downloadUrl: `https://${HOST}:${cdn.port}`,
      caFile: pki.caCertPath,
      restart,
      health: { command: `${bin}/gateway health`, timeout: '1s', poll: '100ms' },
      // Never used: NO_PROXY names 127.0.0.1, where every server here listens.
      httpsProxy: 'http://127.0.0.1:9',
    }),
    GATEWAY_UPGRADE_DATA_DIR: dataDir,
  };
}, 120_000);

afterAll(async () => {
  for (const s of [rogue?.server, proxy?.server, publicProxy?.server, cdn, rogueCdn, proxyCdn]) await s?.close();
  await pki?.cleanup();
  if (dir) await rm(dir, { recursive: true, force: true });
});

beforeEach(async () => {
  await writeFile(join(bin, 'gateway'), await fakeGatewayScript('17.0.1'), { mode: 0o755 });
  await rm(restartLog, { force: true });
  await writeSchedule(etc, [{ start: new Date(Date.now() - 60_000), stop: new Date(Date.now() + 3_600_000) }]);
  cdnRequests.length = 0;
  rogueCdnRequests.length = 0;
  proxyCdnRequests.length = 0;
  for (const h of [rogue, proxy, publicProxy]) h.requests.length = 0;
});

async function endpoint(host: VersionHost): Promise<void> {
  await writeFile(join(etc, 'endpoint'), `${HOST}:${host.server.port}/v1/webapi/automaticupgrades/channel/default\n`);
}
const installed = async () => (await readFile(join(bin, 'gateway'), 'utf8')).match(/Gateway v(\S+)/)?.[1];
const restarts = async () => (await readFile(restartLog, 'utf8').catch(() => '')).split('\n').filter(Boolean);

describe('gateway-upgrade asks only a Proxy of the cluster, or a server of a CA outside it', () => {
  it('HOSTILE: an agent\'s certificate under the Proxy\'s name: GW_ERR_TLS_WRONG_ROLE, nothing asked, downloaded or installed', async () => {
    await endpoint(rogue);
    const r = await runCli('gateway-upgrade', ['run'], { env, timeoutMs: 60_000 });
    expect(r.status, r.stdout).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_TLS_WRONG_ROLE');
    expect(r.stderr).toContain('is a host certificate with the roles node, not a Proxy\'s');
    expect(r.stdout).not.toContain('an upgrade is available');
    // Refused in the handshake: the rogue server got no request (no /version, no /critical, no ping).
    expect(rogue.requests).toEqual([]);
    expect(cdnRequests).toEqual([]);
    expect(await installed()).toBe('17.0.1');
    expect(await restarts()).toEqual([]);

    const dry = await runCli('gateway-upgrade', ['dry-run'], { env, timeoutMs: 60_000 });
    expect(dry.status).toBe(1);
    expect(dry.stderr).toContain('code: GW_ERR_TLS_WRONG_ROLE');
    expect(rogue.requests).toEqual([]);
  });

  it('a real Proxy\'s certificate (role proxy, the same CA): the version is taken and installed', async () => {
    await endpoint(proxy);
    const r = await runCli('gateway-upgrade', ['run'], { env, timeoutMs: 60_000 });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toContain('upgraded gateway 17.0.1 -> 17.0.2; the service is running 17.0.2');
    expect(proxy.requests).toContain('/v1/webapi/automaticupgrades/channel/default/version');
    expect(await installed()).toBe('17.0.2');
  });

  it('a certificate of a CA outside the cluster (GATEWAY_UPGRADE_CA_FILE, no gateway identity): chain and name, as before', async () => {
    await endpoint(publicProxy);
    const r = await runCli('gateway-upgrade', ['run'], { env, timeoutMs: 60_000 });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toContain('upgraded gateway 17.0.1 -> 17.0.2; the service is running 17.0.2');
    expect(await installed()).toBe('17.0.2');
  });
});

describe('the release download location is never a member of the cluster', () => {
  it("HOSTILE: an agent's certificate at the download location, serving a release with its checksum: GW_ERR_TLS_WRONG_ROLE, nothing installed", async () => {
    await endpoint(proxy);
    const r = await runCli('gateway-upgrade', ['run'], { env: { ...env, GATEWAY_UPGRADE_DOWNLOAD_URL: `https://${HOST}:${rogueCdn.port}` }, timeoutMs: 60_000 });
    expect(r.status, r.stdout).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_TLS_WRONG_ROLE');
    expect(r.stderr).toContain('belongs to a host of the cluster (roles: node), not to the release download server');
    expect(rogueCdnRequests).toEqual([]);
    expect(await installed()).toBe('17.0.1');
    expect(await restarts()).toEqual([]);
  });

  it("a Proxy's certificate at the download location (its artifact route): the release is taken and installed", async () => {
    await endpoint(proxy);
    const direct = await download(`https://${HOST}:${proxyCdn.port}/v1/webapi/autoupdate/artifacts/gateway-ent-v17.0.2-linux-amd64-bin.tar.gz`, join(dir, 'via-proxy.tar.gz'), { dialer: new Dialer({ env: {} }), ca: [cluster.caPem] });
    expect(direct.bytes).toBeGreaterThan(0);
    const viaUrl = await runCli('gateway-upgrade', ['run'], { env: { ...env, GATEWAY_UPGRADE_DOWNLOAD_URL: `https://${HOST}:${proxyCdn.port}/v1/webapi/autoupdate/artifacts` }, timeoutMs: 60_000 });
    expect(viaUrl.status, viaUrl.stderr).toBe(0);
    expect(viaUrl.stdout).toContain('upgraded gateway 17.0.1 -> 17.0.2');
    expect(proxyCdnRequests).toContain('/v1/webapi/autoupdate/artifacts/gateway-ent-v17.0.2-linux-amd64-bin.tar.gz');
    expect(await installed()).toBe('17.0.2');
  });

  it('HOSTILE: the tarball itself from that server (download, every redirect hop): refused before any byte', async () => {
    const dest = join(dir, 'rogue.tar.gz');
    const err = await download(`https://${HOST}:${rogueCdn.port}/gateway-ent-v17.0.2-linux-amd64-bin.tar.gz`, dest, { dialer: new Dialer({ env: {} }), ca: [cluster.caPem] }).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'GW_ERR_TLS_WRONG_ROLE' });
    expect(rogueCdnRequests).toEqual([]);
    const outside = await readFile(pki.caCertPath, 'utf8');
    const redirected = await download(`https://${HOST}:${cdn.port}/moved`, dest, { dialer: new Dialer({ env: {} }), ca: [cluster.caPem, outside] }).catch((e: unknown) => e);
    expect(redirected).toMatchObject({ code: 'GW_ERR_TLS_WRONG_ROLE' });
    expect(cdnRequests).toEqual(['/moved']);
    expect(rogueCdnRequests).toEqual([]);
    // A server of a CA outside the cluster (the real download location's kind) still serves it.
    const got = await download(`https://${HOST}:${cdn.port}/gateway-ent-v17.0.2-linux-amd64-bin.tar.gz`, dest, { dialer: new Dialer({ env: {} }), ca: [cluster.caPem, outside] });
    expect(got.bytes).toBeGreaterThan(0);
  });
});

describe("the Kubernetes updater's channel client", () => {
  const source = (host: VersionHost, ca: string) =>
    channelVersionSource({ baseUrl: `https://${HOST}:${host.server.port}/v1/webapi/automaticupgrades/channel/default`, dialer: new Dialer({ env: {} }), ca });

  it("HOSTILE: an agent's certificate under the Proxy's name (--ca-file is the cluster CA): GW_ERR_TLS_WRONG_ROLE, nothing asked", async () => {
    const err = await source(rogue, cluster.caPem)().catch((e: unknown) => e);
    expect(err).toBeInstanceOf(GatewayError);
    expect((err as GatewayError).code).toBe('GW_ERR_TLS_WRONG_ROLE');
    expect(rogue.requests).toEqual([]);
  });

  it("a real Proxy's certificate and one of a CA outside the cluster: the channel's version", async () => {
    expect(await source(proxy, cluster.caPem)()).toEqual({ version: 'v17.0.2', critical: false });
    expect(await source(publicProxy, await readFile(pki.caCertPath, 'utf8'))()).toEqual({ version: 'v17.0.2', critical: false });
  });
});

describe('bearsIdentity', () => {
  it("tells the cluster CA's certificates from others", async () => {
    expect(bearsIdentity(agentCert.certPem)).toBe(true);
    expect(bearsIdentity(proxyCert.certPem)).toBe(true);
    expect(bearsIdentity((await pki.serverCert({ names: ['x.gw.test'], ips: [] })).certPem)).toBe(false);
    expect(bearsIdentity(undefined)).toBe(false);
  });
});
