/**
 * gateway-upgrade under a managed rollout (issue 28; src/upgrade/instruction.ts, docs/upgrades.md "Managed
 * rollouts"), the built CLI on the tarball path: a tiny HTTPS Proxy of the test answers the instruction on
 * /v1/webapi/autoupdate/agent (and the channel's version server, which names another version, so a fallback to
 * it shows), release tarballs come from a download server through a real squid. The maintenance window is closed
 * throughout: only the instruction can make a run install now.
 *
 *   update now, an upgrade; not now (the reason, exit 0); a downgrade for a rollback; the last run keeps the
 *   rollout's id and reason; managed:false and 404 keep the channel's behaviour; malformed, oversized, slow, 5xx
 *   answers: nothing installed, nothing asked of the channel or the download server, GW_ERR_UPGRADE_INSTRUCTION.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { chmod, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { Dialer } from '../../src/dial/dialer.js';
import { createLogger, setRootLogger } from '../../src/log.js';
import { VersionServer } from '../../src/proxy/versions.js';
import { readLastRun } from '../../src/upgrade/lastrun.js';
import { writeSchedule } from '../../src/upgrade/schedule.js';
import { AUTOUPDATE_AGENT_PATH, type AgentInstruction } from '../../src/wire/autoupdate.js';
import { runCli } from '../helpers/gateway.js';
import { startHttpsServer, type HttpTestServer } from '../helpers/servers.js';
import { startSquid, type Squid } from '../helpers/squid.js';
import { makeTestPki, type TestPki } from '../helpers/tls.js';
import { fakeGatewayScript, makeTarball, startReleaseServer, tarballUpgradeEnv, writeScript } from './helpers.js';

setRootLogger(createLogger({ level: 'silent' }));

const CDN_IP = '127.0.0.3';
const CDN_NAME = 'cdn.gw.test';
const HOST_ID = '5b0c1d2e-0000-4000-8000-00000000a001';

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
const cdnRequests: string[] = [];
/** Every path the Proxy was asked, in order. */
const proxyRequests: string[] = [];
/** How the Proxy answers the instruction, per test. */
let answer: (req: IncomingMessage, res: ServerResponse) => void;
const json = (body: unknown, status = 200) => (_req: IncomingMessage, res: ServerResponse) => {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
};
const managed = (o: Partial<AgentInstruction>): AgentInstruction => ({ managed: true, update: false, reason: 'r', ...o });

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'gw-rollout-upgrade-'));
  await chmod(dir, 0o755);
  await writeFile(join(dir, 'hosts'), `${CDN_IP} ${CDN_NAME}\n`, { mode: 0o644 });
  pki = await makeTestPki();
  squid = await startSquid({ extraConfig: [`hosts_file ${join(dir, 'hosts')}`] });
  for (const t of [await makeTarball('17.0.1', 'amd64'), await makeTarball('17.0.2', 'amd64')]) {
    files.set(`/${t.name}`, t.body);
    files.set(`/${t.name}.sha256`, `${t.sha256}  ${t.name}\n`);
  }
  cdn = await startReleaseServer(pki, CDN_NAME, CDN_IP, { files, requests: cdnRequests });
  // The channel names 17.0.3 (no tarball of it exists): a run that followed the channel would show it.
  const cert = await pki.serverCert({ names: ['proxy.gw.test'], ips: ['127.0.0.1'] });
  const channels = new VersionServer({ ownVersion: '17.0.2', channels: { default: { static_version: 'v17.0.3' } }, dialer: new Dialer({ env: {} }) });
  proxy = await startHttpsServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
    proxyRequests.push(req.url ?? '');
    if ((req.url ?? '').startsWith(AUTOUPDATE_AGENT_PATH)) return answer(req, res);
    if (channels.handle(req, res)) return;
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ server_version: '17.0.2' }));
  });

  root = join(dir, 'root');
  bin = join(root, 'usr/local/bin');
  etc = join(root, 'etc/gateway-upgrade.d');
  await mkdir(bin, { recursive: true });
  await mkdir(etc, { recursive: true });
  // The agent's identity, as it stores it: the host ID the rollout knows this host by.
  await mkdir(join(root, 'var/lib/gateway/host'), { recursive: true });
  await writeFile(join(root, 'var/lib/gateway/host/identity.json'), JSON.stringify({ hostId: HOST_ID, cluster: 'c', roles: ['node'], nodename: 'n', server: 'x' }));
  await writeFile(join(etc, 'endpoint'), `127.0.0.1:${proxy.port}/v1/webapi/automaticupgrades/channel/default\n`);
  restartLog = join(dir, 'restarts.log');
  const restart = await writeScript(join(dir, 'restart.sh'), `echo "restart $(${bin}/gateway --version)" >> ${restartLog}`);
  env = {
    ...tarballUpgradeEnv({ root, bin, downloadUrl: `https://${CDN_NAME}:${cdn.port}`, caFile: pki.caCertPath, restart, health: { command: `${bin}/gateway health`, timeout: '1s', poll: '100ms' }, httpsProxy: squid.url }),
    GATEWAY_UPGRADE_INSTRUCTION_TIMEOUT: '2s',
  };
}, 120_000);

afterAll(async () => {
  await cdn?.close();
  await proxy?.close();
  await squid?.stop();
  await pki?.cleanup();
  if (dir) await rm(dir, { recursive: true, force: true });
});

async function install(version: string): Promise<void> {
  await rm(join(bin, 'gateway'), { force: true });
  await writeFile(join(bin, 'gateway'), await fakeGatewayScript(version), { mode: 0o755 });
}

beforeEach(async () => {
  await install('17.0.1');
  await rm(restartLog, { force: true });
  await rm(join(etc, 'group'), { force: true });
  await rm(join(etc, 'last-run'), { force: true });
  // The only window opens in a day: the channel's path would wait.
  await writeSchedule(etc, [{ start: new Date(Date.now() + 86_400_000), stop: new Date(Date.now() + 90_000_000) }]);
  cdnRequests.length = 0;
  proxyRequests.length = 0;
});

const installed = async () => (await readFile(join(bin, 'gateway'), 'utf8')).match(/Gateway v(\S+)/)?.[1];
const restarts = async () => (await readFile(restartLog, 'utf8').catch(() => '')).split('\n').filter(Boolean);
const upgrade = (args: string[]) => runCli('gateway-upgrade', args, { env, timeoutMs: 60_000 });
const askedChannel = () => proxyRequests.some((p) => p.includes('/automaticupgrades/'));

describe('gateway-upgrade under a managed rollout', () => {
  it('update: installs the instruction\'s version now, outside any window; asks with the host ID and the group file; the last run keeps the rollout', async () => {
    await writeFile(join(etc, 'group'), 'canary-eu\n');
    answer = json(managed({ version: '17.0.2', update: true, reason: 'canary of group canary-eu', group: 'canary-eu', canary: true, rollout_id: 'r-7' }));
    const r = await upgrade(['run']);
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toContain('rollout r-7: group canary-eu, a canary; target 17.0.2, update now: canary of group canary-eu');
    expect(r.stdout).toContain('an upgrade is available (17.0.1 -> 17.0.2)');
    expect(r.stdout).toContain('upgraded gateway 17.0.1 -> 17.0.2; the service is running 17.0.2');
    expect(await installed()).toBe('17.0.2');
    expect(await restarts()).toEqual(['restart Gateway v17.0.2 git:test']);
    expect(proxyRequests[0]).toBe(`${AUTOUPDATE_AGENT_PATH}?host_id=${HOST_ID}&group=canary-eu`);
    expect(askedChannel()).toBe(false);
    expect(readLastRun(etc)).toMatchObject({ result: 'upgraded', current: '17.0.1', target: '17.0.2', rollout_id: 'r-7', reason: 'canary of group canary-eu' });
  });

  it('not now: prints the reason, installs nothing, exits 0', async () => {
    answer = json(managed({ version: '17.0.2', update: false, reason: 'group prod waits for dev', group: 'prod', rollout_id: 'r-7' }));
    const r = await upgrade(['run']);
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toContain('not upgrading to 17.0.2 now: group prod waits for dev');
    expect(await installed()).toBe('17.0.1');
    expect(cdnRequests).toEqual([]);
    expect(askedChannel()).toBe(false);
    expect(readLastRun(etc)).toMatchObject({ result: 'waiting', rollout_id: 'r-7', reason: 'group prod waits for dev' });
  });

  it('a rollback: a downgrade to the start version, with the same restart and health wait', async () => {
    await install('17.0.2');
    answer = json(managed({ version: '17.0.1', update: true, reason: 'rollback of group dev to 17.0.1', group: 'dev', rollout_id: 'r-8' }));
    const r = await upgrade(['run']);
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toContain('the rollout moves this host back (17.0.2 -> 17.0.1)');
    expect(await installed()).toBe('17.0.1');
    expect(await restarts()).toEqual(['restart Gateway v17.0.1 git:test']);
    expect(readLastRun(etc)).toMatchObject({ result: 'upgraded', current: '17.0.2', target: '17.0.1', rollout_id: 'r-8' });
  });

  it('dry-run prints the instruction, in text and in JSON', async () => {
    answer = json(managed({ version: '17.0.2', update: true, reason: 'canary of group dev', group: 'dev', canary: true, rollout_id: 'r-9' }));
    const text = await upgrade(['dry-run']);
    expect(text.status, text.stderr).toBe(0);
    expect(text.stdout).toContain('rollout r-9: group dev, a canary; target 17.0.2, update now: canary of group dev');
    expect(text.stdout).toContain('an upgrade is available (17.0.1 -> 17.0.2)');
    expect(text.stdout).toContain('install: tarball');
    const j = await upgrade(['dry-run', '-f', 'json']);
    expect(JSON.parse(j.stdout)).toMatchObject({
      installed_version: '17.0.1',
      target_version: '17.0.2',
      upgrade_available: true,
      maintenance_window: { state: 'managed' },
      rollout: { managed: true, version: '17.0.2', update: true, group: 'dev', canary: true, reason: 'canary of group dev', rollout_id: 'r-9' },
    });
    expect(await installed()).toBe('17.0.1');
  });

  it.each([
    ['managed:false', json({ managed: false, update: false, reason: 'no autoupdate_config' })],
    ['404 (a Proxy of an earlier version)', json({ error: { message: 'not found' } }, 404)],
  ])('%s: the channel and its window decide, as before', async (_what, how) => {
    answer = how;
    const r = await upgrade(['run']);
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toContain('an upgrade is available (17.0.1 -> 17.0.3)');
    expect(r.stdout).toContain('not upgrading: outside the maintenance window');
    expect(askedChannel()).toBe(true);
    const dry = await upgrade(['dry-run']);
    expect(dry.stdout).toMatch(/rollout: none, the channel decides: /);
  });

  it('a host with no agent identity is in no rollout: the instruction is not asked', async () => {
    answer = json(managed({ version: '17.0.2', update: true }));
    const r = await runCli('gateway-upgrade', ['dry-run'], { env: { ...env, GATEWAY_UPGRADE_DATA_DIR: join(dir, 'nowhere') }, timeoutMs: 60_000 });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toContain('an upgrade is available (17.0.1 -> 17.0.3)');
    expect(r.stdout).not.toContain('rollout');
    expect(proxyRequests.some((p) => p.startsWith(AUTOUPDATE_AGENT_PATH))).toBe(false);
  });

  const drip = (_req: IncomingMessage, res: ServerResponse) => {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write('{"managed":true,"update":true,"version":"17.0.2","reason":"');
    const t = setInterval(() => res.write('a'), 300);
    res.on('close', () => clearInterval(t));
  };
  it.each([
    ['malformed JSON', (_q: IncomingMessage, res: ServerResponse) => void res.writeHead(200).end('{"managed": tru'), /not JSON/],
    ['wrong types', json({ managed: 'yes', update: 1, reason: 'r', version: '17.0.2' }), /managed is not true or false/],
    ['an update with a version that is not one', json(managed({ version: '17.0.2; reboot', update: true })), /version is not a version number/],
    ['an oversized answer (20 KiB)', json(managed({ version: '17.0.2', update: true, reason: 'x'.repeat(20 * 1024) })), /larger than 16384 bytes/],
    ['a slow answer, dripping past the deadline', drip, /no complete answer within 2 s/],
    ['HTTP 500', json({ error: { message: 'auth down' } }, 500), /answered HTTP 500/],
    ['HTTP 503', json({}, 503), /answered HTTP 503/],
  ])('%s: nothing installed, the channel not asked, GW_ERR_UPGRADE_INSTRUCTION, exit 1', async (_what, how, why) => {
    answer = how;
    for (const args of [['run'], ['dry-run']]) {
      proxyRequests.length = 0;
      const r = await upgrade(args);
      expect(r.status, `${args[0]}: ${r.stdout}`).toBe(1);
      expect(r.stderr).toContain('code: GW_ERR_UPGRADE_INSTRUCTION');
      expect(r.stderr).toMatch(why);
      expect(r.stderr).toContain('nothing was installed');
      expect(r.stderr).toMatch(/hint: /);
      expect(askedChannel()).toBe(false);
    }
    expect(await installed()).toBe('17.0.1');
    expect(await restarts()).toEqual([]);
    expect(cdnRequests).toEqual([]);
    expect(readLastRun(etc)).toMatchObject({ result: 'failed', code: 'GW_ERR_UPGRADE_INSTRUCTION' });
  });

  it('a group file that is not a group name is refused before anything is asked', async () => {
    await writeFile(join(etc, 'group'), 'Prod; reboot\n');
    answer = json(managed({ version: '17.0.2', update: true }));
    const r = await upgrade(['run']);
    expect(r.status).toBe(1);
    expect(r.stderr).toContain('code: GW_ERR_UPGRADE_INSTRUCTION');
    expect(proxyRequests).toEqual([]);
    expect(await installed()).toBe('17.0.1');
  });
});

describe("last-run's rollout fields", () => {
  it('are kept when they are an id and a line of text, and make the record unreadable otherwise', async () => {
    const { parseLastRun } = await import('../../src/upgrade/lastrun.js');
    const base = { version: 'v1', at: 1, result: 'waiting' };
    expect(parseLastRun(JSON.stringify({ ...base, rollout_id: 'r-1', reason: 'group prod waits for dev' }))).toEqual({ at: 1, result: 'waiting', rollout_id: 'r-1', reason: 'group prod waits for dev' });
    expect(parseLastRun(JSON.stringify({ ...base, rollout_id: 'r 1' }))).toBeUndefined();
    expect(parseLastRun(JSON.stringify({ ...base, reason: 'a\u001b[2J' }))).toBeUndefined();
    expect(parseLastRun(JSON.stringify({ ...base, reason: 'x'.repeat(600) }))).toBeUndefined();
  });
});
