/**
 * The rollout's planner, pure (src/auth/rollout/): groups in order with their windows in their own time zones,
 * canaries, halting on measured health, rollback, the safety rules, agents going away and groups shrinking or
 * growing. Each test drives step() with a clock it moves itself.
 */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { applyCommand } from '../../../src/auth/rollout/commands.js';
import { instructionFor } from '../../../src/auth/rollout/instruction.js';
import { CANARY_GONE_MS, step, type PlanInput } from '../../../src/auth/rollout/plan.js';
import { checkVersionResource, versionHold } from '../../../src/auth/rollout/safety.js';
import type { RolloutAgent, RolloutState } from '../../../src/auth/rollout/state.js';
import { statusOf } from '../../../src/auth/rollout/status.js';
import type { AutoupdateConfigSpec, AutoupdateGroup, AutoupdateVersionSpec } from '../../../src/auth/resources/index.js';
import { isGatewayError } from '../../../src/errors.js';

const ALL_DAYS: AutoupdateGroup['days'] = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'];
const MIN = 60_000;
const HOUR = 60 * MIN;

function group(name: string, o: Partial<AutoupdateGroup> = {}): AutoupdateGroup {
  return { name, days: ALL_DAYS, start_hour: 0, time_zone: 'UTC', wait_hours: 0, canary_count: 0, ...o };
}

function config(groups: AutoupdateGroup[], o: Partial<AutoupdateConfigSpec['agents']> = {}): AutoupdateConfigSpec {
  return { agents: { mode: 'enabled', strategy: 'halt-on-error', maintenance_window_duration: '1h', canary_healthy_for: '5m', canary_deadline: '30m', stale_after: '24h', schedules: { regular: groups }, ...o } };
}

function version(o: Partial<AutoupdateVersionSpec['agents']> = {}): AutoupdateVersionSpec {
  return { agents: { start_version: '17.0.0', target_version: '17.1.0', schedule: 'immediate', mode: 'enabled', critical: false, ...o } };
}

const T0 = Date.parse('2030-03-04T00:00:00Z'); // a Monday

function uuid(n: number): string {
  return `00000000-0000-4000-8000-${String(n).padStart(12, '0')}`;
}

function agent(n: number, v: string, o: Partial<RolloutAgent> = {}): RolloutAgent {
  return { hostId: uuid(n), nodename: `node-${n}`, version: v, connectedAt: new Date(T0 - HOUR).toISOString(), lastHeartbeat: new Date(T0).toISOString(), ...o };
}

/** The agent as it is after it upgraded to v at `at` and measured its health (ok or not). */
function upgraded(a: RolloutAgent, v: string, at: number, ok = true): RolloutAgent {
  return { ...a, version: v, connectedAt: new Date(at).toISOString(), health: { ok, checks: [{ name: 'tunnel', ok: true }, { name: 'resources', ok, ...(ok ? {} : { detail: 'postgres does not answer' }) }], measured_at: new Date(at + 1000).toISOString() } };
}

/** A small world: inputs and a step that keeps the state. */
class World {
  state: RolloutState | undefined;
  events: string[] = [];
  constructor(public input: Omit<PlanInput, 'state'>) {}
  step(now = this.input.now): RolloutState {
    this.input = { ...this.input, now };
    const out = step({ ...this.input, state: this.state });
    this.state = out.state;
    this.events.push(...out.events.map((e) => `${e.type}:${e.group ?? ''}`));
    return this.state!;
  }
  groupState(name: string): string | undefined {
    return this.state?.groups.find((g) => g.name === name)?.state;
  }
  instruction(n: number) {
    return instructionFor({ ...this.input, state: this.state }, uuid(n));
  }
  command(c: Parameters<typeof applyCommand>[1]) {
    const { state, event } = applyCommand(this.state!, c, this.input.now);
    this.state = state;
    this.events.push(`${event.type}:${event.group ?? ''}`);
  }
}

describe('the default and the resources', () => {
  it('no resources: not managed, the channels apply', () => {
    const i = instructionFor({ agents: [], controlPlane: '17.2.0', now: T0 }, uuid(1));
    expect(i).toMatchObject({ managed: false, update: false });
    expect(step({ agents: [], controlPlane: '17.2.0', now: T0 }).state).toBeUndefined();
  });

  it('a config without a target: managed, nothing upgrades', () => {
    const i = instructionFor({ config: config([group('dev')]), agents: [agent(1, '17.0.0')], controlPlane: '17.2.0', now: T0 }, uuid(1));
    expect(i).toMatchObject({ managed: true, update: false });
    expect(i.reason).toMatch(/until an operator sets a target/);
  });

  it('a config of mode disabled: not managed', () => {
    const i = instructionFor({ config: config([group('dev')], { mode: 'disabled' }), version: version(), agents: [], controlPlane: '17.2.0', now: T0 }, uuid(1));
    expect(i.managed).toBe(false);
  });

  it('catch_all disabled: an agent in no group never upgrades and is counted as ungrouped', () => {
    const w = new World({ config: config([group('dev')], { catch_all: 'disabled' }), version: version(), agents: [agent(1, '17.0.0'), agent(2, '17.0.0', { upgradeGroup: 'dev' })], controlPlane: '17.2.0', now: T0 });
    w.step();
    expect(w.instruction(1)).toMatchObject({ update: false, group: '' });
    expect(w.instruction(2)).toMatchObject({ update: true, group: 'dev' });
    expect(statusOf({ ...w.input, state: w.state }).ungrouped).toBe(1);
  });
});

describe('what an asker says', () => {
  it('a connected agent is placed by its presence, never by the group its upgrader names in the query', () => {
    const w = new World({ config: config([group('canaries', { canary_count: 0 }), group('prod', { start_hour: 12 })]), version: version({ schedule: 'regular' }), agents: [agent(1, '17.0.0', { upgradeGroup: 'prod' })], controlPlane: '17.2.0', now: T0 });
    w.step();
    const lying = instructionFor({ ...w.input, state: w.state }, uuid(1), 'canaries');
    expect(lying).toMatchObject({ group: 'prod', update: false });
    // An agent without presence (not connected yet) gets the answer of the group it names, and moves nothing.
    expect(instructionFor({ ...w.input, state: w.state }, uuid(9), 'canaries')).toMatchObject({ group: 'canaries', update: true });
    expect(step({ ...w.input, state: w.state }).state).toEqual(w.state);
  });

  it('a canary\'s oversized check detail is cut in the halt\'s reason', () => {
    const w = new World({ config: config([group('dev', { canary_count: 1 })]), version: version(), agents: [agent(1, '17.0.0')], controlPlane: '17.2.0', now: T0 });
    w.step();
    const a = upgraded(agent(1, '17.0.0'), '17.1.0', T0 + MIN, false);
    a.health!.checks[1]!.detail = 'x'.repeat(100_000);
    w.input = { ...w.input, agents: [a] };
    w.step(T0 + 2 * MIN);
    expect(w.groupState('dev')).toBe('halted');
    expect(w.state!.groups[0]!.reason.length).toBeLessThan(1000);
  });
});

describe('groups, canaries and halting', () => {
  it('canaries first, then the group, then the next group', () => {
    const agents = [1, 2, 3, 4].map((n) => agent(n, '17.0.0', { upgradeGroup: 'dev' })).concat([agent(5, '17.0.0', { upgradeGroup: 'prod' })]);
    const w = new World({ config: config([group('dev', { canary_count: 1 }), group('prod')]), version: version(), agents, controlPlane: '17.2.0', now: T0 });
    w.step();
    expect(w.groupState('dev')).toBe('canary');
    expect(w.groupState('prod')).toBe('unstarted');
    const canary = w.state!.groups[0]!.canaries[0]!;
    const n = Number(canary.host_id.slice(-12));
    expect(w.instruction(n)).toMatchObject({ update: true, canary: true, version: '17.1.0' });
    const other = [1, 2, 3, 4].find((x) => x !== n)!;
    expect(w.instruction(other)).toMatchObject({ update: false, version: '17.0.0' });
    expect(w.instruction(5).reason).toMatch(/waits for group dev/);
    // The canary upgrades and is healthy: not enough yet, then for canary_healthy_for.
    w.input = { ...w.input, agents: w.input.agents.map((a) => (a.hostId === canary.host_id ? upgraded(a, '17.1.0', T0 + MIN) : a)) };
    w.step(T0 + 2 * MIN);
    expect(w.groupState('dev')).toBe('canary');
    w.step(T0 + 8 * MIN);
    expect(w.groupState('dev')).toBe('active');
    expect(w.instruction(other)).toMatchObject({ update: true, version: '17.1.0' });
    // Everyone upgrades: done, and prod starts.
    w.input = { ...w.input, agents: w.input.agents.map((a) => (a.upgradeGroup === 'dev' ? upgraded(a, '17.1.0', T0 + 9 * MIN) : a)) };
    w.step(T0 + 10 * MIN);
    expect(w.groupState('dev')).toBe('done');
    expect(w.groupState('prod')).toBe('active');
    expect(w.events).toEqual(['autoupdate.group_started:dev', 'autoupdate.canary_healthy:dev', 'autoupdate.done:dev', 'autoupdate.group_started:prod']);
  });

  it.each([
    ['reports itself unhealthy on the target', (a: RolloutAgent) => upgraded(a, '17.1.0', T0 + MIN, false), T0 + 2 * MIN, /unhealthy.*postgres does not answer/],
    ['its upgrader reports a failed run', (a: RolloutAgent) => ({ ...a, health: { ok: true, checks: [], measured_at: new Date(T0 + MIN).toISOString(), upgrader: { result: 'failed', at: new Date(T0 + MIN).toISOString(), code: 'GW_ERR_UPGRADE_VERIFY' } } }), T0 + 2 * MIN, /upgrader reported a failed run \(GW_ERR_UPGRADE_VERIFY\)/],
    ['it is not healthy on the target by canary_deadline', (a: RolloutAgent) => a, T0 + 31 * MIN, /not healthy on 17\.1\.0 within canary_deadline/],
  ])('a canary that %s halts its group, which rolls its canaries back', (_what, change, at, why) => {
    const agents = [1, 2, 3].map((n) => agent(n, '17.0.0', { upgradeGroup: 'dev' }));
    const w = new World({ config: config([group('dev', { canary_count: 2 }), group('prod')]), version: version(), agents, controlPlane: '17.2.0', now: T0 });
    w.step();
    const [c1, c2] = w.state!.groups[0]!.canaries;
    w.input = { ...w.input, agents: w.input.agents.map((a) => (a.hostId === c1!.host_id ? change(a) : a)) };
    w.step(at);
    expect(w.groupState('dev')).toBe('halted');
    expect(w.state!.groups[0]!.reason).toMatch(why);
    expect(w.state!.groups[0]!.reason).toContain(c1!.host_id);
    expect(w.state!.halts).toBe(1);
    expect(w.events).toContain('autoupdate.halted:dev');
    // Both canaries go back to the start version; the rest never moved; the next group waits.
    for (const c of [c1!, c2!]) expect(w.instruction(Number(c.host_id.slice(-12)))).toMatchObject({ update: true, canary: true, version: '17.0.0' });
    const rest = [1, 2, 3].find((n) => uuid(n) !== c1!.host_id && uuid(n) !== c2!.host_id)!;
    expect(w.instruction(rest)).toMatchObject({ update: false });
    expect(w.groupState('prod')).toBe('unstarted');
    w.step(at + HOUR);
    expect(w.groupState('dev')).toBe('halted');
  });

  it('a canary gone before it upgraded is replaced; a group whose agents all went away is done', () => {
    const agents = [1, 2].map((n) => agent(n, '17.0.0'));
    const w = new World({ config: config([group('dev', { canary_count: 1 })]), version: version(), agents, controlPlane: '17.2.0', now: T0 });
    w.step();
    const first = w.state!.groups[0]!.canaries[0]!;
    w.input = { ...w.input, agents: w.input.agents.filter((a) => a.hostId !== first.host_id) };
    w.step(T0 + MIN);
    expect(w.state!.groups[0]!.canaries.map((c) => c.host_id)).toEqual([first.host_id]);
    w.step(T0 + MIN + CANARY_GONE_MS + 1);
    const now = w.state!.groups[0]!.canaries;
    expect(now.map((c) => c.host_id)).not.toContain(first.host_id);
    expect(now).toHaveLength(1);
    w.input = { ...w.input, agents: [] };
    w.step(T0 + 2 * CANARY_GONE_MS + 2 * MIN);
    w.step(T0 + 2 * CANARY_GONE_MS + 3 * MIN);
    expect(w.groupState('dev')).toBe('done');
  });

  it('agents joining an active group follow it; a group that grows after it is done upgrades its newcomers', () => {
    const w = new World({ config: config([group('dev')]), version: version(), agents: [agent(1, '17.1.0')], controlPlane: '17.2.0', now: T0 });
    w.step();
    expect(w.groupState('dev')).toBe('done');
    w.input = { ...w.input, agents: [agent(1, '17.1.0'), agent(2, '17.0.0')] };
    w.step(T0 + MIN);
    expect(w.instruction(2)).toMatchObject({ update: true, version: '17.1.0' });
  });
});

describe('windows in each group\'s time zone', () => {
  it('halt-on-error: a group starts in its window after the previous group and its wait_hours', () => {
    const cfg = config([group('dev', { start_hour: 9, time_zone: 'Europe/Paris' }), group('prod', { start_hour: 9, time_zone: 'America/New_York', wait_hours: 1 })]);
    const w = new World({ config: cfg, version: version({ schedule: 'regular' }), agents: [agent(1, '17.0.0', { upgradeGroup: 'dev' }), agent(2, '17.0.0', { upgradeGroup: 'prod' })], controlPlane: '17.2.0', now: T0 });
    w.step(); // 00:00 UTC = 01:00 Paris: not yet
    expect(w.groupState('dev')).toBe('unstarted');
    const status = statusOf({ ...w.input, state: w.state });
    expect(status.groups[0]!.next_start).toBe('2030-03-04T08:00:00.000Z'); // 09:00 CET
    w.step(Date.parse('2030-03-04T08:00:00Z'));
    expect(w.groupState('dev')).toBe('active');
    w.input = { ...w.input, agents: [agent(1, '17.1.0', { upgradeGroup: 'dev' }), agent(2, '17.0.0', { upgradeGroup: 'prod' })] };
    w.step(Date.parse('2030-03-04T08:10:00Z'));
    expect(w.groupState('dev')).toBe('done');
    // prod: 09:10 UTC + 1h wait; its next window is 09:00 New York (EST, 14:00 UTC).
    expect(statusOf({ ...w.input, state: w.state }).groups[1]!.next_start).toBe('2030-03-04T14:00:00.000Z');
    w.step(Date.parse('2030-03-04T13:59:00Z'));
    expect(w.groupState('prod')).toBe('unstarted');
    w.step(Date.parse('2030-03-04T14:00:00Z'));
    expect(w.groupState('prod')).toBe('active');
  });

  it('a window that closed while the group waited is not one it starts in: the next one is', () => {
    const w = new World({ config: config([group('dev', { start_hour: 8 })]), version: version({ schedule: 'regular' }), agents: [agent(1, '17.0.0')], controlPlane: '17.2.0', now: T0 });
    w.step();
    w.step(T0 + 10 * HOUR); // no step ran in 08:00..09:00
    expect(w.groupState('dev')).toBe('unstarted');
    expect(statusOf({ ...w.input, state: w.state }).groups[0]!.next_start).toBe('2030-03-05T08:00:00.000Z');
    w.step(T0 + 32 * HOUR + MIN);
    expect(w.groupState('dev')).toBe('active');
  });

  it.each([
    // Europe/Paris goes forward on 2030-03-31 (02:00 → 03:00) and back on 2030-10-27 (03:00 → 02:00).
    ['Europe/Paris', 2, '2030-03-30T12:00:00Z', '2030-03-31T01:00:00Z'], // 02:00 does not exist: opens at 03:00 CEST
    ['Europe/Paris', 9, '2030-03-30T12:00:00Z', '2030-03-31T07:00:00Z'], // 09:00 CEST, no longer 08:00 UTC
    ['Europe/Paris', 2, '2030-10-26T12:00:00Z', '2030-10-27T00:00:00Z'], // 02:00 happens twice: the first (CEST)
    ['America/New_York', 9, '2030-03-09T20:00:00Z', '2030-03-10T13:00:00Z'], // after the US change (EDT)
    ['Asia/Kolkata', 9, '2030-03-04T00:00:00Z', '2030-03-04T03:30:00Z'], // a half-hour offset
    ['UTC', 0, '2030-03-04T00:00:00Z', '2030-03-04T00:00:00Z'],
  ])('%s at %i: from %s the window opens at %s', (zone, hour, from, expected) => {
    const w = new World({ config: config([group('g', { start_hour: hour, time_zone: zone })]), version: version({ schedule: 'regular' }), agents: [agent(1, '17.0.0')], controlPlane: '17.2.0', now: Date.parse(from) });
    w.step();
    expect(statusOf({ ...w.input, state: w.state }).groups[0]!.next_start ?? w.state!.groups[0]!.started_at).toBe(new Date(expected).toISOString());
  });

  it('time-based: each group only inside its own window, independently', () => {
    const cfg = config([group('eu', { start_hour: 1 }), group('us', { start_hour: 3 })], { strategy: 'time-based', maintenance_window_duration: '1h' });
    const agents = [agent(1, '17.0.0', { upgradeGroup: 'eu' }), agent(2, '17.0.0', { upgradeGroup: 'us' })];
    const w = new World({ config: cfg, version: version({ schedule: 'regular' }), agents, controlPlane: '17.2.0', now: T0 + 3 * HOUR + MIN });
    w.step();
    expect(w.groupState('eu')).toBe('unstarted');
    expect(w.groupState('us')).toBe('active');
    expect(w.instruction(1).update).toBe(false);
    expect(w.instruction(2).update).toBe(true);
    w.step(T0 + 4 * HOUR + MIN);
    expect(w.instruction(2).update).toBe(false);
  });

  it('only a critical or immediate release skips the window', () => {
    const base = { config: config([group('g', { start_hour: 12 })]), agents: [agent(1, '17.0.0')], controlPlane: '17.2.0', now: T0 };
    expect(step({ ...base, version: version({ schedule: 'regular' }) }).state!.groups[0]!.state).toBe('unstarted');
    expect(step({ ...base, version: version({ schedule: 'regular', critical: true }) }).state!.groups[0]!.state).toBe('active');
    expect(step({ ...base, version: version({ schedule: 'immediate' }) }).state!.groups[0]!.state).toBe('active');
  });
});

describe('commands', () => {
  function twoGroups() {
    const agents = [agent(1, '17.0.0', { upgradeGroup: 'dev' }), agent(2, '17.0.0', { upgradeGroup: 'prod' })];
    return new World({ config: config([group('dev'), group('prod', { start_hour: 12 })]), version: version({ schedule: 'regular' }), agents, controlPlane: '17.2.0', now: T0 });
  }

  it('suspend holds everything, resume goes on', () => {
    const w = twoGroups();
    w.step();
    w.command({ command: 'suspend', by: 'alice' });
    expect(w.instruction(1)).toMatchObject({ update: false });
    expect(w.instruction(1).reason).toMatch(/suspended/);
    w.command({ command: 'resume', by: 'alice' });
    expect(w.instruction(1)).toMatchObject({ update: true });
    expect(w.events).toEqual(['autoupdate.group_started:dev', 'autoupdate.suspended:', 'autoupdate.resumed:']);
  });

  it('start --group starts a group now, skipping its window and the group before it', () => {
    const w = twoGroups();
    w.step();
    expect(w.groupState('prod')).toBe('unstarted');
    w.command({ command: 'start', group: 'prod', by: 'alice' });
    w.step();
    expect(w.groupState('prod')).toBe('active');
  });

  it('mark-done lets the next group go on', () => {
    const w = new World({ config: config([group('dev'), group('prod')]), version: version(), agents: [agent(1, '17.0.0', { upgradeGroup: 'dev' }), agent(2, '17.0.0', { upgradeGroup: 'prod' })], controlPlane: '17.2.0', now: T0 });
    w.step();
    expect(w.groupState('prod')).toBe('unstarted');
    w.command({ command: 'mark-done', group: 'dev', by: 'alice' });
    w.step();
    expect(w.groupState('prod')).toBe('active');
  });

  it('rollback walks back through the groups and canaries; --now moves everyone at once', () => {
    const cfg = config([group('dev', { canary_count: 1 }), group('prod')]);
    const agents = [1, 2].map((n) => agent(n, '17.1.0', { upgradeGroup: 'dev' })).concat([agent(3, '17.1.0', { upgradeGroup: 'prod' })]);
    const w = new World({ config: cfg, version: version(), agents, controlPlane: '17.2.0', now: T0 });
    w.step();
    expect(w.groupState('prod')).toBe('done');
    const before = w.state!.rollout_id;
    w.command({ command: 'rollback', by: 'alice' });
    expect(w.state!.rollout_id).not.toBe(before);
    w.step();
    expect(w.groupState('dev')).toBe('canary');
    const canary = w.state!.groups[0]!.canaries[0]!;
    expect(w.instruction(Number(canary.host_id.slice(-12)))).toMatchObject({ update: true, version: '17.0.0', canary: true });
    expect(w.instruction(3)).toMatchObject({ update: false, version: '17.1.0' });
    w.command({ command: 'rollback', now: true, by: 'alice' });
    w.step();
    for (const n of [1, 2, 3]) expect(w.instruction(n)).toMatchObject({ update: true, version: '17.0.0' });
    expect(w.state!.groups.every((g) => g.canaries.length === 0)).toBe(true);
    w.input = { ...w.input, agents: w.input.agents.map((a) => ({ ...a, version: '17.0.0' })) };
    w.step();
    expect(w.state!.groups.map((g) => g.state)).toEqual(['rolledback', 'rolledback']);
  });

  it('a command naming no group is refused with its code', () => {
    const w = twoGroups();
    w.step();
    expect(() => w.command({ command: 'start', group: 'nope', by: 'alice' })).toThrow(expect.objectContaining({ code: 'GW_ERR_AUTOUPDATE_GROUP' }));
  });
});

describe('safety rules', () => {
  it.each([
    ['18.0.0', '17.0.0', '17.2.0', /above the control plane/],
    ['19.0.0', '17.0.0', '19.0.0', /more than one major above the agent/],
    ['18.1.0', '17.5.0', '18.0.0', undefined],
    ['16.0.0', '17.0.0', '17.0.0', undefined], // going down is never held
  ])('target %s on an agent of %s under a control plane of %s', (target, agentVersion, cp, why) => {
    const hold = versionHold(target, agentVersion, cp);
    if (why === undefined) expect(hold).toBeUndefined();
    else expect(hold).toMatch(why);
  });

  it('an autoupdate_version above the control plane or jumping two majors is refused', () => {
    for (const [start, target] of [['17.0.0', '18.0.0'], ['15.0.0', '17.0.0']] as const) {
      let err: unknown;
      try {
        checkVersionResource(start, target, '17.3.0');
      } catch (e) {
        err = e;
      }
      expect(isGatewayError(err, 'GW_ERR_AUTOUPDATE_MAJOR')).toBe(true);
    }
    expect(() => checkVersionResource('16.0.0', '17.1.0', '17.3.0')).not.toThrow();
  });

  it('the planner holds an agent two majors behind, and names the rule', () => {
    const w = new World({ config: config([group('dev')]), version: version({ start_version: '16.0.0', target_version: '17.1.0' }), agents: [agent(1, '15.2.0'), agent(2, '16.0.0')], controlPlane: '17.2.0', now: T0 });
    w.step();
    expect(w.instruction(1)).toMatchObject({ update: false });
    expect(w.instruction(1).reason).toMatch(/one major at a time/);
    expect(w.instruction(2)).toMatchObject({ update: true });
    // The held agent does not keep its group from being done.
    w.input = { ...w.input, agents: [agent(1, '15.2.0'), agent(2, '17.1.0')] };
    w.step();
    expect(w.groupState('dev')).toBe('done');
    expect(w.state!.groups[0]!.reason).toMatch(/1 held by the safety rules/);
  });

  it('stale agents are listed per group', () => {
    const old = { ok: true, checks: [], measured_at: new Date(T0).toISOString(), upgrader: { result: 'up-to-date', at: new Date(T0 - 48 * HOUR).toISOString() } };
    const s = statusOf({ config: config([group('dev')]), version: version(), agents: [agent(1, '17.0.0', { health: old }), agent(2, '17.0.0')], controlPlane: '17.2.0', now: T0, state: undefined });
    expect(s.groups[0]!.stale).toEqual([{ host_id: uuid(1), nodename: 'node-1', last_run: old.upgrader.at }]);
  });
});

describe('properties', () => {
  it('whatever the agents do, a step never tells a held agent to update, and never a non-canary while canaries run', () => {
    const agentArb = fc.record({
      n: fc.integer({ min: 1, max: 12 }),
      version: fc.constantFrom('15.0.0', '16.0.0', '17.0.0', '17.1.0'),
      group: fc.constantFrom(undefined, 'dev', 'prod', 'other'),
      ok: fc.boolean(),
    });
    fc.assert(
      fc.property(fc.array(fc.array(agentArb, { maxLength: 12 }), { minLength: 1, maxLength: 6 }), fc.integer({ min: 0, max: 5 }), (rounds, canaries) => {
        const w = new World({ config: config([group('dev', { canary_count: canaries }), group('prod', { canary_count: 1 })]), version: version(), agents: [], controlPlane: '17.2.0', now: T0 });
        rounds.forEach((round, i) => {
          const seen = new Map(round.map((r) => [r.n, r]));
          w.input = { ...w.input, agents: [...seen.values()].map((r) => upgraded(agent(r.n, r.version, r.group ? { upgradeGroup: r.group } : {}), r.version, T0, r.ok)) };
          w.step(T0 + i * 7 * MIN);
          for (const r of seen.values()) {
            const ins = w.instruction(r.n);
            if (ins.update && ins.version === '17.1.0') expect(versionHold('17.1.0', r.version, '17.2.0')).toBeUndefined();
            const g = w.state!.groups.find((x) => x.name === ins.group);
            if (g?.state === 'canary' && ins.update) expect(g.canaries.some((c) => c.host_id === uuid(r.n))).toBe(true);
            expect(g?.canaries.length ?? 0).toBeLessThanOrEqual(5);
          }
        });
      }),
      { numRuns: 200 },
    );
  });
});
