/**
 * Tarball installs with the built CLI: release tarballs (and .sha256 files) served over https on loopback with a
 * test CA; the download goes through a real squid (the tarball server's name exists only in squid's hosts file)
 * while the version server (in-process, behind https) is reached directly through NO_PROXY. A bad checksum is
 * refused before anything is extracted; a build that does not come back gets the previous binaries back.
 */
import { spawn } from 'node:child_process';
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { download } from '../../src/upgrade/download.js';
import { readLastRun } from '../../src/upgrade/lastrun.js';
import { progressBar, renderBar } from '../../src/upgrade/progress.js';
import { writeSchedule } from '../../src/upgrade/schedule.js';
import { runCli } from '../helpers/gateway.js';
import type { HttpTestServer } from '../helpers/servers.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { fakeGatewayScript, makeTarball, startReleaseServer, startVersionProxy, tarballUpgradeEnv, writeScript, type Tarball } from './helpers.js';
import { releaseAround, sha256, snapshot, targz, type RawEntry } from './tarball-fixtures.js';

setRootLogger(createLogger({ level: 'silent' }));

const CDN_IP = '127.0.0.3';
const CDN_NAME = 'cdn.gw.test';

let dir: string;
let pki: TestPki;
let squid: Squid;
let cdn: HttpTestServer;
let proxy: HttpTestServer;
let root: string;
const LAST_RUN = 'etc/gateway-upgrade.d/last-run';
let bin: string;
let etc: string;
let restartLog: string;
let env: Record<string, string>;
const files = new Map<string, Buffer | string>();
/** Paths the CDN answers in its own way (a cut connection, a lying Content-Length). */
const special = new Map<string, (res: import('node:http').ServerResponse) => void>();
const requests: string[] = [];
/** Channels of the version server, one per case: channel name -> version. */
const CASES = {
  dotdot: '17.0.6',
  absolute: '17.0.7',
  linkout: '17.0.8',
  truncated: '17.0.9',
  huge: '17.0.10',
  longer: '17.0.11',
  noversion: '17.0.12',
  failing: '17.0.13',
  lib: '17.0.14',
  libbroken: '17.0.15',
  linkabs: '17.0.16',
} as const;
const nameOf = (version: string) => `gateway-ent-v${version}-linux-amd64-bin.tar.gz`;
/** Serves body as the release `version` with a .sha256 that matches it. */
function serve(version: string, body: Buffer): void {
  files.set(`/${nameOf(version)}`, body);
  files.set(`/${nameOf(version)}.sha256`, `${sha256(body)}  ${nameOf(version)}\n`);
}

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

  await setUpCases();

  cdn = await startReleaseServer(pki, CDN_NAME, CDN_IP, { files, requests, special });
  proxy = await startVersionProxy(pki, '17.0.2', {
    tampered: { static_version: 'v17.0.4' },
    broken: { static_version: 'v17.0.5' },
    ...Object.fromEntries(Object.entries(CASES).map(([c, v]) => [c, { static_version: `v${v}` }])),
  });

  root = join(dir, 'root');
  bin = join(root, 'usr/local/bin');
  etc = join(root, 'etc/gateway-upgrade.d');
  await mkdir(bin, { recursive: true });
  await mkdir(etc, { recursive: true });
  restartLog = join(dir, 'restarts.log');
  const restart = await writeScript(join(dir, 'restart.sh'), `echo "restart $(${bin}/gateway --version)" >> ${restartLog}`);
  env = tarballUpgradeEnv({
    root,
    bin,
    downloadUrl: `https://${CDN_NAME}:${cdn.port}`,
    caFile: pki.caCertPath,
    restart,
    health: { command: `${bin}/gateway health`, timeout: '1s', poll: '100ms' },
    httpsProxy: squid.url,
  });
}, 120_000);

const gatewayScript = (version: string, versionExit = 0) =>
  `#!/bin/sh\ncase "$1" in --version) echo "Gateway v${version} git:test"; exit ${versionExit} ;; health) exit 0 ;; esac\n`;

/** A release shaped like the packaged one: the app in lib/ (GATEWAY_LIB_DIR), bin/gateway a link into it. */
function libRelease(version: string, healthy: boolean): Buffer {
  const install = [
    '#!/bin/sh',
    'set -eu',
    'rm -rf "$GATEWAY_LIB_DIR.new" && mkdir -p "$(dirname "$GATEWAY_LIB_DIR")" "$GATEWAY_BIN_DIR"',
    'cp -R lib "$GATEWAY_LIB_DIR.new" && rm -rf "$GATEWAY_LIB_DIR" && mv "$GATEWAY_LIB_DIR.new" "$GATEWAY_LIB_DIR"',
    'ln -sfn ../lib/gateway/bin/gateway "$GATEWAY_BIN_DIR/.gateway.new" && mv -T "$GATEWAY_BIN_DIR/.gateway.new" "$GATEWAY_BIN_DIR/gateway"',
    'echo "installed into $GATEWAY_BIN_DIR and $GATEWAY_LIB_DIR"',
    '',
  ].join('\n');
  const gw = `#!/bin/sh\ncase "$1" in --version) echo "Gateway v${version} git:test" ;; health) exit ${healthy ? 0 : 1} ;; esac\n`;
  return targz([
    { name: 'gateway/', type: '5' },
    { name: 'gateway/install.sh', mode: 0o755, body: install },
    { name: 'gateway/lib/', type: '5' },
    { name: 'gateway/lib/bin/', type: '5' },
    { name: 'gateway/lib/bin/gateway', mode: 0o755, body: gw },
    { name: 'gateway/lib/VERSION', body: `${version}\n` },
    { name: 'gateway/bin/', type: '5' },
    { name: 'gateway/bin/gateway', type: '2', link: '../lib/bin/gateway' },
  ]);
}

/** The releases of the cases: hostile entries (with a checksum that matches: the entry check refuses them). */
async function setUpCases(): Promise<void> {
  const out = `${'../'.repeat(16)}${dir.slice(1)}`;
  serve(CASES.dotdot, releaseAround(CASES.dotdot, [{ name: `gateway/${out}/escaped`, body: 'pwned' }]));
  serve(CASES.absolute, releaseAround(CASES.absolute, [{ name: `${dir}/escaped`, body: 'pwned' }]));
  serve(CASES.linkout, releaseAround(CASES.linkout, [{ name: 'gateway/out', type: '2', link: `${out}/outside` }]));
  serve(CASES.linkabs, releaseAround(CASES.linkabs, [{ name: 'gateway/out', type: '2', link: `${dir}/outside` }, { name: 'gateway/out/escaped', body: 'pwned' }]));
  const good = releaseAround(CASES.truncated, []);
  serve(CASES.truncated, good);
  special.set(`/${nameOf(CASES.truncated)}`, (res) => {
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': good.length });
    res.write(good.subarray(0, good.length >> 1), () => res.socket?.destroy());
  });
  serve(CASES.huge, good);
  special.set(`/${nameOf(CASES.huge)}`, (res) => {
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': String(64 * 1024 ** 3) });
    res.write(good.subarray(0, 100));
  });
  // Announces 100 bytes, sends a whole tarball: whatever the client reads is not what the .sha256 describes.
  const big = releaseAround(CASES.longer, [{ name: 'gateway/filler', body: Buffer.alloc(256 * 1024, 7) }]);
  serve(CASES.longer, big);
  special.set(`/${nameOf(CASES.longer)}`, (res) => {
    res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': 100 });
    res.socket?.write(big);
    res.end();
  });
  serve(
    CASES.noversion,
    targz([
      { name: 'gateway/', type: '5' },
      { name: 'gateway/install', mode: 0o755, body: '#!/bin/sh\nset -eu\ncp gateway "$GATEWAY_BIN_DIR/gateway"\n' },
      { name: 'gateway/gateway', mode: 0o755, body: gatewayScript(CASES.noversion, 1) },
    ] as RawEntry[]),
  );
  serve(
    CASES.failing,
    targz([
      { name: 'gateway/', type: '5' },
      { name: 'gateway/install', mode: 0o755, body: '#!/bin/sh\ncp gateway "$GATEWAY_BIN_DIR/gateway"\necho "disk full" >&2\nexit 3\n' },
      { name: 'gateway/gateway', mode: 0o755, body: gatewayScript(CASES.failing) },
    ] as RawEntry[]),
  );
  serve(CASES.lib, libRelease(CASES.lib, true));
  serve(CASES.libbroken, libRelease(CASES.libbroken, false));
}

afterAll(async () => {
  await cdn?.close();
  await proxy?.close();
  await squid?.stop();
  await pki?.cleanup();
  if (dir) await rm(dir, { recursive: true, force: true });
});

beforeEach(async () => {
  await rm(join(bin, 'gateway'), { force: true });
  await rm(join(root, 'usr/local/lib'), { recursive: true, force: true });
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
    const before = await snapshot(root);
    const r = await runCli('gateway-upgrade', ['run'], { env, timeoutMs: 60_000 });
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(
      /error: checksum mismatch for gateway-ent-v17\.0\.4-linux-amd64-bin\.tar\.gz: gateway-ent-v17\.0\.4-linux-amd64-bin\.tar\.gz\.sha256 says sha256 [0-9a-f]{64}, the download has [0-9a-f]{64}; nothing was extracted or installed/,
    );
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_CHECKSUM');
    expect(r.stderr).not.toContain('installed into');
    expect(await installed()).toBe('17.0.1');
    expect(await restarts()).toEqual([]);
    // Files, links, modes under the whole root (the endpoint, the schedule, the binaries): all as they were, but for
    // the record of this run the agent's metrics read (src/upgrade/lastrun.ts).
    const { [LAST_RUN]: lastRun, ...after } = await snapshot(root);
    const { [LAST_RUN]: _previous, ...beforeRest } = before;
    expect(after).toEqual(beforeRest);
    expect(lastRun).toMatch(/^file 644 /);
    expect(readLastRun(join(root, 'etc', 'gateway-upgrade.d'))).toMatchObject({ result: 'failed', code: 'GW_ERR_UPGRADE_CHECKSUM', current: '17.0.1', target: '17.0.4' });
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

  it('a hand-over whose successor never takes over (the pid file still names the old process): GW_ERR_UPGRADE_HEALTH, put back', async () => {
    await endpoint('default');
    const pidFile = join(root, 'run/gateway.pid');
    await mkdir(join(root, 'run'), { recursive: true });
    await writeFile(pidFile, `${process.pid}\n`); // alive, and the restart (restart.sh) leaves it as it is
    try {
      const r = await runCli('gateway-upgrade', ['run'], { env, timeoutMs: 60_000 });
      expect(r.status).toBe(1);
      expect(r.stderr).toContain('code: GW_ERR_UPGRADE_HEALTH');
      expect(r.stderr).toContain(`the service's main process is still pid ${process.pid}`);
      expect(await installed()).toBe('17.0.1');
    } finally {
      await rm(pidFile, { force: true });
    }
  });

  it('a hand-over whose successor takes over (a new live pid in the pid file): upgraded', async () => {
    await endpoint('default');
    const pidFile = join(root, 'run/gateway.pid');
    await mkdir(join(root, 'run'), { recursive: true });
    await writeFile(pidFile, `${process.pid}\n`);
    const successor = spawn('sleep', ['60'], { stdio: 'ignore' });
    try {
      // The restart writes the successor's pid, as a successor of a hand-over does.
      const r = await runCli('gateway-upgrade', ['run'], { env: { ...env, GATEWAY_UPGRADE_RESTART_COMMAND: `echo ${successor.pid} > ${pidFile}` }, timeoutMs: 60_000 });
      expect(r.status, r.stderr).toBe(0);
      expect(await installed()).toBe('17.0.2');
    } finally {
      successor.kill('SIGKILL');
      await rm(pidFile, { force: true });
    }
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

describe('a refused or failed tarball upgrade changes nothing', () => {
  const usr = () => snapshot(join(root, 'usr'));
  const escaped = async () => (await readFile(join(dir, 'escaped'), 'utf8').catch(() => undefined)) ?? (await readFile(join(dir, 'outside'), 'utf8').catch(() => undefined));

  async function refusedRun(channel: keyof typeof CASES, code: string | RegExp): Promise<string> {
    await endpoint(channel);
    const before = await usr();
    const r = await runCli('gateway-upgrade', ['run'], { env, timeoutMs: 60_000 });
    expect(r.status, r.stderr).toBe(1);
    expect(r.stderr).toMatch(typeof code === 'string' ? `code: ${code}` : code);
    expect(await usr()).toEqual(before);
    expect(await escaped()).toBeUndefined();
    expect(await restarts()).toEqual([]);
    expect(await installed()).toBe('17.0.1');
    return r.stderr;
  }

  it.each([
    ['dotdot', /the entry "gateway\/(\.\.\/)+.*\/escaped" climbs out with "\.\."/],
    ['absolute', /the entry "\/.*\/escaped" is an absolute path/],
    ['linkout', /the symbolic link "gateway\/out" points to "(\.\.\/)+.*\/outside", outside the archive/],
    ['linkabs', /the symbolic link "gateway\/out" points to the absolute path "\/.*\/outside"/],
  ] as const)('a tarball with an entry escaping the target (%s): GW_ERR_UPGRADE_TARBALL, nothing extracted', async (channel, message) => {
    const err = await refusedRun(channel, 'GW_ERR_UPGRADE_TARBALL');
    expect(err).toMatch(message);
    expect(err).toContain('nothing was extracted or installed');
    expect(err).not.toContain('installed into');
  });

  it('the hint names the broken release by its address; once its publisher replaces it there, the next run installs it', async () => {
    const err = await refusedRun('dotdot', 'GW_ERR_UPGRADE_TARBALL');
    const url = /^hint: .*?(https:\/\/\S+) is broken or not genuine/m.exec(err)?.[1];
    expect(url).toBe(`https://${CDN_NAME}:${cdn.port}/${nameOf(CASES.dotdot)}`);
    expect(err).not.toContain('{download_url}');
    expect(err).toMatch(/^hint: .*run 'gateway-upgrade run' again once it is replaced/m);
    // What the hint asks for: the publisher puts a genuine release at that address, and the upgrade is run again.
    const genuine = await makeTarball(CASES.dotdot, 'amd64');
    const previous = files.get(new URL(url!).pathname);
    serve(CASES.dotdot, genuine.body);
    try {
      const r = await runCli('gateway-upgrade', ['run'], { env, timeoutMs: 60_000 });
      expect(r.status, r.stderr).toBe(0);
      expect(await installed()).toBe(CASES.dotdot);
    } finally {
      serve(CASES.dotdot, previous as Buffer);
    }
  });

  it('a truncated download: GW_ERR_UPGRADE_DOWNLOAD, nothing extracted', async () => {
    const err = await refusedRun('truncated', 'GW_ERR_UPGRADE_DOWNLOAD');
    expect(err).toMatch(/cannot download https:\/\/cdn\.gw\.test:\d+\/gateway-ent-v17\.0\.9-linux-amd64-bin\.tar\.gz: .*(truncated|aborted)/);
  });

  it('a tarball far larger than a release may be (64 GiB announced): refused before its body is read', async () => {
    const err = await refusedRun('huge', 'GW_ERR_UPGRADE_DOWNLOAD');
    expect(err).toContain(`it announces ${64 * 1024 ** 3} bytes, more than the ${2 * 1024 ** 3} a release may have`);
  });

  it('a body far longer than its Content-Length: malformed HTTP, or the 100 bytes read fail the checksum', async () => {
    // Which one depends on whether the bytes past the 100 arrive before the client has finished: both refuse.
    const err = await refusedRun('longer', /code: GW_ERR_UPGRADE_(DOWNLOAD|CHECKSUM)\n/);
    expect(err).toMatch(/the answer is not valid HTTP|checksum mismatch/);
  });

  it('a new binary that fails its self-check (--version exits 1): the old files are put back, no restart', async () => {
    const err = await refusedRun('noversion', 'GW_ERR_UPGRADE_HEALTH');
    expect(err).toMatch(/the upgrade 17\.0\.1 -> 17\.0\.12 failed: the new binary failed its self-check, before any restart: the version command `.*gateway --version` failed \(exit status 1\)/);
    expect(err).toContain('the previous version 17.0.1 was put back (the service was not restarted)');
  });

  it('an install script that fails half-way: the old files are put back', async () => {
    const err = await refusedRun('failing', 'GW_ERR_UPGRADE_INSTALL');
    expect(err).toMatch(/the install script of gateway-ent-v17\.0\.13-linux-amd64-bin\.tar\.gz failed \(exit status 3\): disk full; the previous files were put back/);
  });

  it('an app directory and a command that is a link into it: upgraded, then a broken build puts both back exactly', async () => {
    await endpoint('lib');
    let r = await runCli('gateway-upgrade', ['run'], { env, timeoutMs: 60_000 });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stderr).toContain(`installed into ${bin} and ${join(root, 'usr/local/lib/gateway')}`);
    const good = await usr();
    expect(good['local/bin/gateway']).toBe('link ../lib/gateway/bin/gateway');
    expect(good['local/lib/gateway/VERSION']).toMatch(/^file /);
    await rm(restartLog, { force: true });

    await endpoint('libbroken');
    r = await runCli('gateway-upgrade', ['run'], { env, timeoutMs: 60_000 });
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_HEALTH');
    expect(r.stderr).toContain('the previous version 17.0.14 was put back and is running');
    expect(await restarts()).toEqual(['restart Gateway v17.0.15 git:test', 'restart Gateway v17.0.14 git:test']);
    // The same tree, link for link and byte for byte; no copy left next to it.
    expect(await usr()).toEqual(good);
  });
});

describe('download caps, in process through squid', () => {
  it('a body without Content-Length is cut at the cap', async () => {
    special.set('/endless', (res) => {
      res.writeHead(200, { 'content-type': 'application/octet-stream' });
      const chunk = Buffer.alloc(64 * 1024, 1);
      let sent = 0;
      const more = () => {
        while (sent < 4 * 1024 * 1024 && !res.destroyed) {
          sent += chunk.length;
          if (!res.write(chunk)) return void res.once('drain', more);
        }
        res.end();
      };
      more();
    });
    const dialer = new Dialer({ env: { HTTPS_PROXY: squid.url } });
    const dest = join(dir, 'endless.bin');
    await expect(download(`https://${CDN_NAME}:${cdn.port}/endless`, dest, { dialer, ca: [pki.caPem], maxBytes: 256 * 1024 })).rejects.toMatchObject({
      code: 'GW_ERR_UPGRADE_DOWNLOAD',
      message: expect.stringContaining('it sends more than the 262144 bytes a release may have'),
    });
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
