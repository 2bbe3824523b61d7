/**
 * The rollout's controller on a real backend (SQLite in memory) through the AuthService facade: resources stored
 * and refused, a step recorded in the audit log, a halt on a canary's unhealthy presence, commands with their
 * rights, autoupdate_agent_rollout read-only, and two Auth Services on one backend never double-stepping.
 */
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { openSqliteBackend } from '../../../src/backend/index.js';
import type { Identity } from '../../../src/auth/pki.js';
import type { Presence } from '../../../src/auth/records.js';
import { parseManifest } from '../../../src/auth/resources/index.js';
import { AuthService } from '../../../src/auth/service.js';
import { enableMetrics } from '../../../src/metrics/define.js';
import { registry } from '../../../src/metrics/registry.js';
import { codeOf } from '../../helpers/errors.js';
import { waitUntil } from '../../helpers/wait.js';
import { parseExposition, sampleValue } from '../../helpers/metrics.js';

enableMetrics();

let now = Date.parse('2030-03-04T10:00:00Z');
const clock = () => now;
let backend: ReturnType<typeof openSqliteBackend>;
let auth: AuthService;
let admin: Identity;
const PROXY = 'proxy-1';

const CONFIG = `kind: autoupdate_config
spec:
  agents:
    canary_healthy_for: 10s
    schedules:
      regular:
        - name: dev
          canary_count: 1
        - name: prod
`;
const VERSION = 'kind: autoupdate_version\nspec:\n  agents:\n    start_version: 17.0.0\n    target_version: 17.1.0\n    schedule: immediate\n';

const hostId = (n: number) => `00000000-0000-4000-8000-${String(n).padStart(12, '0')}`;

async function presence(n: number, o: Partial<Presence> = {}): Promise<void> {
  const at = new Date(now).toISOString();
  await auth.setPresence({ hostId: hostId(n), nodename: `node-${n}`, proxyId: PROXY, services: ['ssh'], resources: { databases: [], apps: [], desktops: [], kube_clusters: [] } as never, connectedAt: at, lastHeartbeat: at, version: '17.0.0', upgradeGroup: 'dev', ...o }, 3600_000);
}

async function events(): Promise<string[]> {
  return (await auth.listEvents(admin, 1000)).map((e) => String(e.event.event)).filter((e) => e.startsWith('autoupdate.')).reverse();
}

beforeEach(async () => {
  now = Date.parse('2030-03-04T10:00:00Z');
  backend = openSqliteBackend({ path: ':memory:', clock, sweepIntervalMs: 0 });
  auth = await AuthService.open({ backend, clusterName: 'unit.example', clock, controlPlaneVersion: '17.2.0' });
  admin = auth.adminIdentity();
  await auth.heartbeatProxy({ id: PROXY, nodename: 'p', version: '17.2.0', public_addr: 'p:443', channels_digest: 'x', channels: {}, started_at: new Date(now - 60_000).toISOString(), last_heartbeat: new Date(now).toISOString() }, 3600_000);
});

afterEach(async () => {
  await auth.closeRollout();
  await backend.close();
});

describe('the rollout controller', () => {
  it('no resources: the instruction is unmanaged and nothing is stored', async () => {
    await presence(1);
    expect(await auth.stepRollout()).toEqual([]);
    expect(await auth.autoupdateInstruction(hostId(1))).toMatchObject({ managed: false, update: false });
    expect(await backend.get('/autoupdate/rollout')).toBeUndefined();
  });

  it('steps, halts on an unhealthy canary, and records each in the audit log', async () => {
    for (const n of [1, 2, 3]) await presence(n);
    await auth.createResources(admin, parseManifest(CONFIG + '---\n' + VERSION, 'm.yaml'), false);
    await auth.stepRollout();
    const status = await auth.autoupdateStatus(admin);
    expect(status.groups.map((g) => g.state)).toEqual(['canary', 'unstarted']);
    const canary = status.groups[0]!.canaries[0]!;
    expect(await auth.autoupdateInstruction(canary.host_id)).toMatchObject({ managed: true, update: true, canary: true, version: '17.1.0', group: 'dev' });
    // The canary comes back on the target and reports a failed check.
    now += 60_000;
    const n = Number(canary.host_id.slice(-12));
    await presence(n, { version: '17.1.0', health: { ok: false, checks: [{ name: 'resources', ok: false, detail: 'db answers nothing' }], measured_at: new Date(now + 1).toISOString() } });
    now += 1000;
    await auth.stepRollout();
    const halted = await auth.autoupdateStatus(admin);
    expect(halted.groups[0]).toMatchObject({ state: 'halted' });
    expect(halted.groups[0]!.reason).toContain('db answers nothing');
    expect(await auth.autoupdateInstruction(canary.host_id)).toMatchObject({ update: true, version: '17.0.0', canary: true });
    expect(await events()).toEqual(['autoupdate.group_started', 'autoupdate.halted']);
    // The metrics say so too: the group's state, one-hot, and the halt counted.
    const scrape = parseExposition(await registry.metrics());
    expect(sampleValue(scrape, 'gateway_autoupdate_group_state', { group: 'dev', state: 'halted' })).toBe(1);
    expect(sampleValue(scrape, 'gateway_autoupdate_group_state', { group: 'dev', state: 'canary' })).toBe(0);
    expect(sampleValue(scrape, 'gateway_autoupdate_halts_total', {})).toBe(1);
    // gwctl get autoupdate_agent_rollout shows the same.
    const [r] = await auth.getResources(admin, 'autoupdate_agent_rollout', undefined, false);
    expect((r!.spec as { groups: Array<{ state: string }> }).groups[0]!.state).toBe('halted');
  });

  it('refuses a target above the control plane, and keeps what was stored', async () => {
    await auth.createResources(admin, parseManifest(VERSION, 'v.yaml'), false);
    const before = await backend.get('/autoupdate/version');
    expect(await codeOf(auth.createResources(admin, parseManifest(VERSION.replace('17.1.0', '18.0.0'), 'v.yaml'), true))).toBe('GW_ERR_AUTOUPDATE_MAJOR');
    expect((await backend.get('/autoupdate/version'))?.value).toBe(before?.value);
  });

  it('gwctl apply refuses a target above the control plane too, applying nothing', async () => {
    const resources = parseManifest(CONFIG + '---\n' + VERSION.replace('17.1.0', '18.0.0'), 'm.yaml');
    expect(await codeOf(auth.applyResources(admin, resources, { dryRun: false, prune: false, set: 'default' }))).toBe('GW_ERR_AUTOUPDATE_MAJOR');
    expect(await backend.get('/autoupdate/config')).toBeUndefined();
  });

  it('autoupdate_agent_rollout cannot be removed', async () => {
    expect(await codeOf(auth.removeResource(admin, 'autoupdate_agent_rollout', 'autoupdate-agent-rollout'))).toBe('GW_ERR_AUTOUPDATE_READ_ONLY');
  });

  it('commands need a rule on the rollout; without a target there is nothing to steer', async () => {
    await auth.addUser(admin, 'alice', ['access'], 'correct horse battery');
    const alice: Identity = { kind: 'user', name: 'alice', cluster: 'unit.example', roles: ['access'] };
    expect(await codeOf(auth.autoupdateStatus(alice))).toBe('GW_ERR_ACCESS_DENIED');
    expect(await codeOf(auth.autoupdateCommand(alice, { command: 'suspend' }))).toBe('GW_ERR_ACCESS_DENIED');
    expect(await codeOf(auth.autoupdateCommand(admin, { command: 'suspend' }))).toBe('GW_ERR_AUTOUPDATE_NOT_CONFIGURED');
    await auth.createResources(admin, parseManifest(VERSION, 'v.yaml'), false);
    await presence(1);
    const s = await auth.autoupdateCommand(admin, { command: 'suspend' });
    expect(s.mode).toBe('suspended');
    expect(await codeOf(auth.autoupdateCommand(admin, { command: 'start', group: 'nope' }))).toBe('GW_ERR_AUTOUPDATE_GROUP');
    expect(await events()).toContain('autoupdate.suspended');
  });

  it('started, it steps after a change of the resources or the presence, not only at its interval', async () => {
    for (const n of [1, 2]) await presence(n);
    auth.startRollout(3600_000);
    await auth.createResources(admin, parseManifest(CONFIG + '---\n' + VERSION, 'm.yaml'), false);
    await waitUntil('the watch steps the new rollout', async () => (await auth.autoupdateStatus(admin)).groups[0]?.state === 'canary');
    const canary = (await auth.autoupdateStatus(admin)).groups[0]!.canaries[0]!;
    await presence(Number(canary.host_id.slice(-12)), { version: '17.1.0', health: { ok: false, checks: [], measured_at: new Date(now + 1).toISOString() } });
    await waitUntil('the watch steps after the presence changed', async () => (await auth.autoupdateStatus(admin)).groups[0]?.state === 'halted');
  });

  it('two Auth Services on one backend step the rollout once: the conditioned write refuses the second', async () => {
    const other = await AuthService.open({ backend, clusterName: 'unit.example', clock, controlPlaneVersion: '17.2.0' });
    for (const n of [1, 2]) await presence(n, { upgradeGroup: 'prod' });
    await auth.createResources(admin, parseManifest(CONFIG + '---\n' + VERSION, 'm.yaml'), false);
    const [a, b] = await Promise.all([auth.stepRollout(), other.stepRollout()]);
    // dev (empty) is done and prod starts: once in all, whichever Auth Service wrote first.
    expect([...a, ...b].map((e) => e.type).sort()).toEqual(['autoupdate.done', 'autoupdate.group_started', 'autoupdate.group_started']);
    expect(await events()).toHaveLength(3);
    await other.closeRollout();
  });
});
