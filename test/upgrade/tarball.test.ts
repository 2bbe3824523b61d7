/**
 * Tarball installs with the built CLI: release tarballs (and .sha256 files) served over https on loopback with a
 * test CA; the download goes through a real squid (the tarball server's name exists only in squid's hosts file)
 * while the version server (in-process, behind https) is reached directly through NO_PROXY. A bad checksum is
 * refused before anything is extracted; a build that does not come back gets the previous binaries back.
 */
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { VersionServer } from '../../src/proxy/versions.js';
import { progressBar, renderBar } from '../../src/upgrade/progress.js';
import { writeSchedule } from '../../src/upgrade/schedule.js';
import { runCli } from '../helpers/gateway.js';
import { startHttpsServer, type HttpTestServer } from '../helpers/servers.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { fakeGatewayScript, makeTarball, writeScript, type Tarball } from './helpers.js';

setRootLogger(createLogger({ level: 'silent' }));

const CDN_IP = '127.0.0.3';
const CDN_NAME = 'cdn.gw.test';

let dir: string;
let pki: TestPki;
let squid: Squid;
let cdn: HttpTestServer;
let proxy: HttpTestServer;
let root: string;
let bin: string;
let etc: string;
let restartLog: string;
let env: Record<string, string>;
const files = new Map<string, Buffer | string>();
const requests: string[] = [];

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-tarball-test-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${CDN_IP} ${CDN_NAME}\n`, { mode: 0o644 });
  pki = await makeTestPki();
  squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });

  const good: Tarball = await makeTarball('17.0.2', 'amd64');
  const tampered: Tarball = await makeTarball('17.0.4', 'amd64');
  const broken: Tarball = await makeTarball('17.0.5', 'amd64', { healthy: false });
  for (const t of [good, tampered, broken]) {
    files.set(`/${t.name}`, t.body);
    files.set(`/${t.name}.sha256`, `${t.sha256}  ${t.name}\n`);
  }
  // The .sha256 of 17.0.4 describes other bytes: what a corrupted or altered download looks like.
  files.set(`/${tampered.name}.sha256`, `${good.sha256}  ${tampered.name}\n`);

  const cdnCert = await pki.serverCert({ names: [CDN_NAME], ips: [CDN_IP] });
  cdn = await startHttpsServer(
    { cert: cdnCert.certPem, key: cdnCert.keyPem },
    (req, res) => {
      requests.push(req.url ?? '');
      const body = files.get(req.url ?? '');
      if (body === undefined) {
        res.writeHead(404);
        res.end();
        return;
      }
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    },
    CDN_IP,
  );

  const proxyCert = await pki.serverCert({ names: ['proxy.gw.test'], ips: ['127.0.0.1'] });
  const vs = new VersionServer({
    ownVersion: '17.0.2',
    channels: { tampered: { static_version: 'v17.0.4' }, broken: { static_version: 'v17.0.5' } },
    dialer: new Dialer({ env: {} }),
  });
  proxy = await startHttpsServer({ cert: proxyCert.certPem, key: proxyCert.keyPem }, (req, res) => {
    if (vs.handle(req, res)) return;
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ server_version: '17.0.2' }));
  });

  root = join(dir, 'root');
  bin = join(root, 'usr/local/bin');
  etc = join(root, 'etc/gateway-upgrade.d');
  await mkdir(bin, { recursive: true });
  await mkdir(etc, { recursive: true });
  restartLog = join(dir, 'restarts.log');
  const restart = await writeScript(join(dir, 'restart.sh'), `echo "restart $(${bin}/gateway --version)" >> ${restartLog}`);
  env = {
    GATEWAY_UPGRADE_ROOT: root,
    GATEWAY_UPGRADE_PACKAGE_MANAGER: 'tarball',
    GATEWAY_UPGRADE_ARCH: 'x64',
    GATEWAY_UPGRADE_DOWNLOAD_URL: `https://${CDN_NAME}:${cdn.port}`,
    GATEWAY_UPGRADE_CA_FILE: pki.caCertPath,
    GATEWAY_UPGRADE_VERSION_COMMAND: `${bin}/gateway --version`,
    GATEWAY_UPGRADE_RESTART_COMMAND: restart,
    GATEWAY_UPGRADE_HEALTH_COMMAND: `${bin}/gateway health`,
    GATEWAY_UPGRADE_HEALTH_TIMEOUT: '1s',
    GATEWAY_UPGRADE_HEALTH_POLL: '100ms',
    HTTPS_PROXY: squid.url,
    NO_PROXY: '127.0.0.1',
  };
}, 120_000);

afterAll(async () => {
  await cdn?.close();
  await proxy?.close();
  await squid?.stop();
  await pki?.cleanup();
  if (dir) await rm(dir, { recursive: true, force: true });
});

beforeEach(async () => {
  await writeFile(join(bin, 'gateway'), await fakeGatewayScript('17.0.1'), { mode: 0o755 });
  await rm(restartLog, { force: true });
  await writeSchedule(etc, [{ start: new Date(Date.now() - 60_000), stop: new Date(Date.now() + 3_600_000) }]);
  requests.length = 0;
});

async function endpoint(channel: string): Promise<void> {
  await writeFile(join(etc, 'endpoint'), `127.0.0.1:${proxy.port}/v1/webapi/automaticupgrades/channel/${channel}\n`);
}
const installed = async () => (await readFile(join(bin, 'gateway'), 'utf8')).match(/Gateway v(\S+)/)?.[1];
const restarts = async () => (await readFile(restartLog, 'utf8').catch(() => '')).split('\n').filter(Boolean);

describe('gateway-upgrade run from a tarball', () => {
  it('downloads through the proxy, checks the checksum, extracts, runs the install step, restarts', async () => {
    await endpoint('default');
    const r = await runCli('gateway-upgrade', ['run'], { env, timeoutMs: 60_000 });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toContain('an upgrade is available (17.0.1 -> 17.0.2)');
    expect(r.stdout).toContain('installing tarball gateway-ent-v17.0.2-linux-amd64-bin.tar.gz');
    expect(r.stdout).toContain('upgraded gateway 17.0.1 -> 17.0.2; the service is running 17.0.2');
    // Not a terminal: one line instead of a bar.
    expect(r.stderr).toMatch(/downloaded gateway-ent-v17\.0\.2-linux-amd64-bin\.tar\.gz \(\d+\.\d MiB\)/);
    expect(r.stderr).toContain(`installed into ${bin}`);
    expect(await installed()).toBe('17.0.2');
    expect(await restarts()).toEqual(['restart Gateway v17.0.2 git:test']);
    expect(requests).toEqual(['/gateway-ent-v17.0.2-linux-amd64-bin.tar.gz.sha256', '/gateway-ent-v17.0.2-linux-amd64-bin.tar.gz']);
    const log = await squid.readAccessLog();
    expect(log.some((l) => l.includes(`CONNECT ${CDN_NAME}:${cdn.port}`))).toBe(true);
  });

  it('a checksum mismatch is refused before extraction: nothing installed, nothing restarted', async () => {
    await endpoint('tampered');
    const r = await runCli('gateway-upgrade', ['run'], { env, timeoutMs: 60_000 });
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(
      /error: checksum mismatch for gateway-ent-v17\.0\.4-linux-amd64-bin\.tar\.gz: gateway-ent-v17\.0\.4-linux-amd64-bin\.tar\.gz\.sha256 says sha256 [0-9a-f]{64}, the download has [0-9a-f]{64}; nothing was extracted or installed/,
    );
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_CHECKSUM');
    expect(r.stderr).not.toContain('installed into');
    expect(await installed()).toBe('17.0.1');
    expect(await restarts()).toEqual([]);
  });

  it('a build that does not come back: the previous binaries are put back and restarted', async () => {
    await endpoint('broken');
    const r = await runCli('gateway-upgrade', ['run'], { env, timeoutMs: 60_000 });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_HEALTH');
    expect(r.stderr).toContain('the previous version 17.0.1 was put back and is running');
    expect(await installed()).toBe('17.0.1');
    expect(await restarts()).toEqual(['restart Gateway v17.0.5 git:test', 'restart Gateway v17.0.1 git:test']);
  });

  it('a release missing on the server is a download error naming the URL', async () => {
    files.delete('/gateway-ent-v17.0.2-linux-amd64-bin.tar.gz.sha256');
    try {
      await endpoint('default');
      const r = await runCli('gateway-upgrade', ['run'], { env, timeoutMs: 60_000 });
      expect(r.status).toBe(1);
      expect(r.stderr).toContain(`error: cannot download https://${CDN_NAME}:${cdn.port}/gateway-ent-v17.0.2-linux-amd64-bin.tar.gz.sha256: HTTP 404`);
      expect(r.stderr).toContain('code: GW_ERR_UPGRADE_DOWNLOAD');
      expect(await installed()).toBe('17.0.1');
    } finally {
      const good = await makeTarball('17.0.2', 'amd64');
      files.set(`/${good.name}`, good.body);
      files.set(`/${good.name}.sha256`, `${good.sha256}  ${good.name}\n`);
    }
  });
});

describe('the progress bar', () => {
  it('draws in place on a terminal', () => {
    expect(renderBar('f.tar.gz', 50 * 1024 * 1024, 100 * 1024 * 1024)).toBe('f.tar.gz [##########··········]  50%  50.0/100.0 MiB');
    expect(renderBar('f.tar.gz', 3 * 1024 * 1024, undefined)).toBe('f.tar.gz 3.0 MiB');
    const out = Object.assign(new PassThrough(), { isTTY: true });
    let text = '';
    out.on('data', (c: Buffer) => (text += c.toString()));
    const bar = progressBar(out, 'f', 1024 * 1024);
    bar.update(512 * 1024);
    bar.update(1024 * 1024);
    bar.done();
    expect(text.startsWith('\rf [##########')).toBe(true);
    expect(text.endsWith('\rf [####################] 100%  1.0/1.0 MiB\n')).toBe(true);
  });
});
