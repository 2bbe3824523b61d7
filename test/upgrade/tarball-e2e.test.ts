/**
 * The tarball path end to end with the project's real release tarballs (`npm run package`, built once per inputs
 * by test/helpers/packages.ts): release N is installed into a temporary root by its own `install` script, as an
 * operator does; then N's own `gateway-upgrade run` (the bundle the tarball carries, on the Node.js runtime it
 * carries) downloads N+1 through a real squid (HTTP CONNECT; the download server's name exists only in squid's
 * hosts file) from an HTTPS server on loopback, and:
 *
 * - a .sha256 that does not match is refused before extraction: the tree under the root is unchanged, file for
 *   file and link for link;
 * - an N+1 whose `gateway --version` exits 1 is installed, fails the upgrader's self-check, and the previous files
 *   are put back (the commands, and the app directory exactly as it was): unchanged again, nothing restarted;
 * - the genuine N+1 is installed by its install script, the service restarted (a script that records what runs),
 *   and N+1 answers; N's app directory stays for a later rollback.
 */
import { execFile } from 'node:child_process';
import { chmod, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger, setRootLogger } from '../../src/log.js';
import { writeSchedule } from '../../src/upgrade/schedule.js';
import { buildPackages, type BuiltPackages } from '../helpers/packages.js';
import type { HttpTestServer } from '../helpers/servers.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { startReleaseServer, startVersionProxy, tarballUpgradeEnv, writeScript } from './helpers.js';
import { sha256, snapshot } from './tarball-fixtures.js';

setRootLogger(createLogger({ level: 'silent' }));
const run = promisify(execFile);

const N = '17.0.0-dev';
const N1 = '17.0.1';
const CDN_IP = '127.0.0.3';
const CDN_NAME = 'cdn.gw.test';

let dir: string;
let pki: TestPki;
let squid: Squid;
let cdn: HttpTestServer;
let proxy: HttpTestServer;
let root: string;
let bin: string;
let restartLog: string;
let env: Record<string, string>;
let good: Buffer;
let broken: Buffer;
let older: Buffer;
let fipsN = '';
let fipsN1 = '';
const files = new Map<string, Buffer | string>();
const requests: string[] = [];
const NAME = `gateway-ent-v${N1}-linux-amd64-bin.tar.gz`;

function serve(body: Buffer, sumOf: Buffer = body): void {
  files.set(`/${NAME}`, body);
  files.set(`/${NAME}.sha256`, `${sha256(sumOf)}  ${NAME}\n`);
}

/** N+1 with its `gateway` command failing --version: what a build broken for this host looks like. */
async function brokenVariant(tarball: string): Promise<Buffer> {
  const work = join(dir, 'broken');
  await mkdir(work, { recursive: true });
  await run('tar', ['-xzf', tarball, '-C', work]);
  const wrapper = join(work, 'gateway', 'gateway');
  const text = await readFile(wrapper, 'utf8');
  const [shebang, ...rest] = text.split('\n');
  await writeFile(wrapper, [shebang, 'case "${1:-}" in -v|--version) echo "gateway: cannot start: broken build" >&2; exit 1 ;; esac', ...rest].join('\n'));
  await run('tar', ['-I', 'gzip -1', '-cf', join(dir, 'broken.tar.gz'), '-C', work, 'gateway']);
  await rm(work, { recursive: true, force: true });
  return readFile(join(dir, 'broken.tar.gz'));
}

beforeAll(async () => {
  // Two builds of the same app (cached across test files and runs: test/helpers/packages.ts). The same versions as
  // test/package/build.test.ts (package.json's and the next): one build serves both files.
  const pn: BuiltPackages = await buildPackages({ version: N });
  const pn1: BuiltPackages = await buildPackages({ version: N1 });
  dir = await mkdtemp(join(tmpdir(), 'gw-tarball-e2e-'));
  await chmod(dir, 0o755);
  good = await readFile(pn1.tarballs.default.tarball);
  older = await readFile(pn.tarballs.default.tarball);
  broken = await brokenVariant(pn1.tarballs.default.tarball);
  fipsN = pn.tarballs.fips.tarball;
  fipsN1 = pn1.tarballs.fips.tarball;

  await writeFile(join(dir, 'hosts'), `${CDN_IP} ${CDN_NAME}\n`, { mode: 0o644 });
  pki = await makeTestPki();
  squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
  cdn = await startReleaseServer(pki, CDN_NAME, CDN_IP, { files, requests });
  proxy = await startVersionProxy(pki, N1);

  // Release N, installed as the install guide says: extract, run ./install (here into the test root).
  root = join(dir, 'root');
  bin = join(root, 'usr/local/bin');
  const etc = join(root, 'etc/gateway-upgrade.d');
  await mkdir(etc, { recursive: true });
  await mkdir(join(dir, 'n'));
  await run('tar', ['-xzf', pn.tarballs.default.tarball, '-C', join(dir, 'n')]);
  await run(join(dir, 'n/gateway/install'), [], { env: { PATH: process.env.PATH ?? '', GATEWAY_BIN_DIR: bin } });
  await rm(join(dir, 'n'), { recursive: true, force: true });
  await writeFile(join(etc, 'endpoint'), `127.0.0.1:${proxy.port}/v1/webapi/automaticupgrades/channel/default\n`);
  await writeSchedule(etc, [{ start: new Date(Date.now() - 60_000), stop: new Date(Date.now() + 3_600_000) }]);

  restartLog = join(dir, 'restarts.log');
  const restart = await writeScript(join(dir, 'restart.sh'), `echo "restart $(${bin}/gateway --version)" >> ${restartLog}`);
  env = {
    PATH: process.env.PATH ?? '',
    ...tarballUpgradeEnv({
      root,
      bin,
      downloadUrl: `https://${CDN_NAME}:${cdn.port}`,
      caFile: pki.caCertPath,
      restart,
      health: { command: `${bin}/gateway --version >/dev/null`, timeout: '30s', poll: '200ms' },
      httpsProxy: squid.url,
    }),
  };
}, 900_000);

afterAll(async () => {
  await cdn?.close();
  await proxy?.close();
  await squid?.stop();
  await pki?.cleanup();
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** N's own gateway-upgrade, as the timer runs it. */
async function upgrade(): Promise<{ code: number; stdout: string; stderr: string }> {
  requests.length = 0;
  await rm(restartLog, { force: true });
  try {
    const r = await run(join(bin, 'gateway-upgrade'), ['run'], { env, timeout: 240_000, maxBuffer: 16 << 20 });
    return { code: 0, stdout: r.stdout, stderr: r.stderr };
  } catch (err) {
    const e = err as { code?: number; stdout?: string; stderr?: string };
    return { code: typeof e.code === 'number' ? e.code : -1, stdout: e.stdout ?? '', stderr: e.stderr ?? '' };
  }
}
const version = async () => (await run(join(bin, 'gateway'), ['--version'])).stdout.trim();
const restarts = async () => (await readFile(restartLog, 'utf8').catch(() => '')).split('\n').filter(Boolean);
const usr = () => snapshot(join(root, 'usr'));

describe(`the real release tarball, ${N} -> ${N1}`, () => {
  it(`release ${N} installed by its install script runs on its own runtime`, async () => {
    expect(await version()).toContain(N);
    expect(await readdir(join(root, 'usr/local/lib/gateway'))).toEqual([N]);
    for (const c of ['gateway', 'gwctl', 'gwsh', 'gateway-upgrade']) expect((await usr())[`local/bin/${c}`]).toMatch(/^file 755 /);
  });

  it('a .sha256 that does not match: refused before extraction, the tree unchanged, nothing restarted', async () => {
    serve(good, older);
    const before = await usr();
    const r = await upgrade();
    expect(r.code, r.stderr).toBe(1);
    expect(r.stdout).toContain(`an upgrade is available (${N} -> ${N1})`);
    expect(r.stderr).toMatch(new RegExp(`checksum mismatch for ${NAME.replaceAll('.', '\\.')}: .* says sha256 ${sha256(older)}, the download has ${sha256(good)}; nothing was extracted or installed`));
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_CHECKSUM');
    expect(requests).toEqual([`/${NAME}.sha256`, `/${NAME}`]);
    expect(await usr()).toEqual(before);
    expect(await restarts()).toEqual([]);
    expect(await version()).toContain(N);
  });

  it(`an ${N1} whose gateway fails --version: installed, fails the self-check, the previous files put back exactly`, async () => {
    serve(broken);
    const before = await usr();
    const r = await upgrade();
    expect(r.code, r.stderr).toBe(1);
    expect(r.stderr).toContain(`installed gateway ${N1}`); // its install script ran
    expect(r.stderr).toMatch(/the new binary failed its self-check, before any restart: the version command `.*gateway --version` failed \(exit status 1\): gateway: cannot start: broken build/);
    expect(r.stderr).toContain(`the previous version ${N} was put back (the service was not restarted)`);
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_HEALTH');
    // The commands, N's app directory, and no trace of N+1 or of the copy kept for the rollback.
    expect(await usr()).toEqual(before);
    expect(await restarts()).toEqual([]);
    expect(await version()).toContain(N);
  });

  it(`the genuine ${N1}: downloaded through squid, installed, restarted, running`, async () => {
    serve(good);
    const r = await upgrade();
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain(`installing tarball ${NAME}`);
    expect(r.stdout).toContain(`upgraded gateway ${N} -> ${N1}; the service is running ${N1}`);
    expect(await version()).toContain(N1);
    expect(await restarts()).toHaveLength(1);
    expect((await restarts())[0]).toContain(N1);
    expect((await readdir(join(root, 'usr/local/lib/gateway'))).sort()).toEqual([N, N1]);
    expect(await readdir(join(root, 'usr/local/lib'))).toEqual(['gateway']); // the copy kept for a rollback is gone
    expect((await readFile(join(bin, 'gateway'), 'utf8'))).toContain(`app='${join(root, 'usr/local/lib/gateway', N1)}'`);
    const log = await squid.readAccessLog();
    expect(log.some((l) => l.includes(`CONNECT ${CDN_NAME}:${cdn.port}`))).toBe(true);
    // The upgrader is now N+1's own.
    expect((await run(join(bin, 'gateway-upgrade'), ['version'])).stdout).toContain(N1);
    const again = await upgrade();
    expect(again.code, again.stderr).toBe(0);
    expect(again.stdout).toContain(`no upgrades available (${N1} == ${N1})`);
  });
});

describe('a FIPS install upgrades from the -fips tarball', () => {
  it(`${N} -fips installed; dry-run names the -fips tarball; run installs ${N1} -fips`, async () => {
    const fipsRoot = join(dir, 'fips-root');
    const fipsBin = join(fipsRoot, 'usr/local/bin');
    await mkdir(join(fipsRoot, 'etc/gateway-upgrade.d'), { recursive: true });
    await mkdir(join(dir, 'fips'));
    await run('tar', ['-xzf', fipsN, '-C', join(dir, 'fips')]);
    await run(join(dir, 'fips/gateway/install'), [], { env: { PATH: process.env.PATH ?? '', GATEWAY_BIN_DIR: fipsBin } });
    await rm(join(dir, 'fips'), { recursive: true, force: true });
    for (const f of ['endpoint', 'schedule']) await writeFile(join(fipsRoot, 'etc/gateway-upgrade.d', f), await readFile(join(root, 'etc/gateway-upgrade.d', f)));
    const fipsName = `gateway-ent-v${N1}-linux-amd64-fips-bin.tar.gz`;
    const body = await readFile(fipsN1);
    files.set(`/${fipsName}`, body);
    files.set(`/${fipsName}.sha256`, `${sha256(body)}  ${fipsName}\n`);
    const fipsEnv = { ...env, GATEWAY_UPGRADE_ROOT: fipsRoot, GATEWAY_UPGRADE_VERSION_COMMAND: `${fipsBin}/gateway --version`, GATEWAY_UPGRADE_HEALTH_COMMAND: `${fipsBin}/gateway --version >/dev/null` };
    expect((await run(join(fipsBin, 'gateway'), ['--version'])).stdout).toMatch(new RegExp(`${N.replaceAll('.', '\\.')}.*FIPS`));
    const dry = await run(join(fipsBin, 'gateway-upgrade'), ['dry-run'], { env: fipsEnv });
    expect(dry.stdout).toContain(`install: tarball https://${CDN_NAME}:${cdn.port}/${fipsName}`);
    requests.length = 0;
    const r = await run(join(fipsBin, 'gateway-upgrade'), ['run'], { env: fipsEnv, timeout: 240_000 });
    expect(r.stdout).toContain(`upgraded gateway-ent-fips ${N} -> ${N1}`);
    expect(requests).toEqual([`/${fipsName}.sha256`, `/${fipsName}`]);
    expect((await run(join(fipsBin, 'gateway'), ['--version'])).stdout).toMatch(new RegExp(`${N1.replaceAll('.', '\\.')}.*FIPS`));
  });
});
