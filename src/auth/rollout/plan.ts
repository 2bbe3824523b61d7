/**
 * The managed rollout's planner, pure: no I/O, the clock passed in (docs/upgrades.md, "Managed rollouts"). One
 * step reads the two resources, the stored state, the agents (their presence) and the control plane's version,
 * and returns the new state and the events of what changed; instructionFor (instruction.ts) and statusOf
 * (status.ts) read the same inputs. Every decision carries a reason sentence that `gwctl autoupdate status` prints.
 *
 * A group (halt-on-error) goes unstarted → canary → active → done, one group after the other: it may start once
 * the group before it is done and its wait_hours have passed, inside its own window (its days and start hour in
 * its time zone, windows.ts), or at once when the release is immediate or critical or an operator started it.
 * Starting, it picks canary_count of its agents that do not run the target yet (a deterministic choice: the hash
 * of rollout id and host id), and only they upgrade. It goes on when every canary has been healthy on the target
 * for canary_healthy_for; it halts by itself when a canary reports itself unhealthy on the target, its upgrader
 * reports a failed run, or it is not healthy on the target by canary_deadline: the canaries go back to the start
 * version, the rest never moved. A canary that goes away before it reached the target is replaced. Active, every
 * agent of the group upgrades; done when every connected agent of it runs the target (those the safety rules
 * hold aside). time-based: each group only inside its own window, independently, without canaries (upstream's
 * time-based strategy has none). A rollback is the same walk towards start_version (or, --now, all at once).
 */
import { createHash } from 'node:crypto';
import type { AgentHealth } from '../../wire/autoupdate.js';
import type { AutoupdateConfigSpec, AutoupdateGroup, AutoupdateVersionSpec } from '../resources/index.js';
import { versionHold } from './safety.js';
import { freshState, groupOf, rolloutId, rulesOf, sameVersion, type CanaryRecord, type GroupRecord, type RolloutAgent, type RolloutEvent, type RolloutState, type Rules } from './state.js';
import { startAt, windowAt } from './windows.js';

export interface PlanInput {
  config?: AutoupdateConfigSpec | undefined;
  version?: AutoupdateVersionSpec | undefined;
  state?: RolloutState | undefined;
  /** Connected agents: one presence each. */
  agents: readonly RolloutAgent[];
  /** The Auth Service's own version. */
  controlPlane: string;
  now: number;
}

export interface PlanOutput {
  /** undefined: no autoupdate_version, nothing to keep. */
  state: RolloutState | undefined;
  events: RolloutEvent[];
}

/** A canary absent this long before it reached the target is gone, and replaced (a restart takes far less). */
export const CANARY_GONE_MS = 3 * 60_000;

/** What one group's step needs besides its record. */
interface GroupCtx {
  rules: Rules;
  spec: AutoupdateGroup;
  state: RolloutState;
  members: RolloutAgent[];
  controlPlane: string;
  skipWindows: boolean;
  /** The group before it (halt-on-error), when there is one. */
  previous: GroupRecord | undefined;
  now: number;
  events: RolloutEvent[];
}

/** One step of the rollout. */
export function step(input: PlanInput): PlanOutput {
  const { version, now } = input;
  if (!version) return { state: undefined, events: [] };
  const rules = rulesOf(input.config);
  const current = input.state && sameVersion(input.state.start_version, version.agents.start_version) && sameVersion(input.state.target_version, version.agents.target_version) ? input.state : undefined;
  const state = syncGroups(current ? structuredClone(current) : freshState(version, rules, now), rules, now);
  const events: RolloutEvent[] = [];
  if (rules.mode !== 'enabled' || version.agents.mode !== 'enabled' || state.suspended) return { state, events };
  const members = membersByGroup(rules, input.agents);
  const skipWindows = version.agents.schedule === 'immediate' || version.agents.critical;
  let previous: GroupRecord | undefined;
  for (const [i, record] of state.groups.entries()) {
    const ctx: GroupCtx = { rules, spec: rules.groups[i]!, state, members: members.get(record.name) ?? [], controlPlane: input.controlPlane, skipWindows, previous, now, events };
    if (rules.strategy === 'time-based') stepTimeBased(record, ctx);
    else stepGroup(record, ctx);
    previous = record;
  }
  return { state, events };
}

/** The state's groups in the config's order: records kept by name, new groups unstarted, removed ones dropped. */
function syncGroups(state: RolloutState, rules: Rules, now: number): RolloutState {
  const byName = new Map(state.groups.map((g) => [g.name, g]));
  const at = new Date(now).toISOString();
  state.groups = rules.groups.map((g) => byName.get(g.name) ?? { name: g.name, state: 'unstarted', reason: 'not started yet', since: at, canaries: [] });
  return state;
}

export function membersByGroup(rules: Rules, agents: readonly RolloutAgent[]): Map<string, RolloutAgent[]> {
  const out = new Map<string, RolloutAgent[]>();
  for (const a of agents) {
    const g = groupOf(rules, a.upgradeGroup);
    if (g === undefined) continue;
    out.set(g, [...(out.get(g) ?? []), a]);
  }
  return out;
}

/** The version a group moves its agents to, and the one they leave. */
export function directionOf(state: RolloutState, g: GroupRecord): { to: string; from: string } {
  return g.back ? { to: state.start_version, from: state.target_version } : { to: state.target_version, from: state.start_version };
}

function set(g: GroupRecord, ctx: GroupCtx, state: GroupRecord['state'], reason: string): void {
  if (g.state !== state) g.since = new Date(ctx.now).toISOString();
  g.state = state;
  g.reason = reason;
}

function emit(ctx: GroupCtx, type: RolloutEvent['type'], g: GroupRecord, reason: string, hostId?: string): void {
  ctx.events.push({ type, rollout_id: ctx.state.rollout_id, group: g.name, reason, ...(hostId ? { host_id: hostId } : {}) });
}

/** Members the group can move: not held by a safety rule. */
function movable(ctx: GroupCtx, to: string): RolloutAgent[] {
  return ctx.members.filter((a) => versionHold(to, a.version, ctx.controlPlane) === undefined || sameVersion(a.version, to));
}

/** Whether every movable member runs `to`; the held ones are named in the reason. */
function allOn(ctx: GroupCtx, to: string): boolean {
  return movable(ctx, to).every((a) => sameVersion(a.version, to));
}

function heldNote(ctx: GroupCtx, to: string): string {
  const held = ctx.members.length - movable(ctx, to).length;
  return held > 0 ? `; ${held} held by the safety rules` : '';
}

function stepGroup(g: GroupRecord, ctx: GroupCtx): void {
  const { to } = directionOf(ctx.state, g);
  if (g.state === 'unstarted') tryStart(g, ctx);
  if (g.state === 'canary') watchCanaries(g, ctx);
  if (g.state === 'halted') markRolledBack(g, ctx);
  if (g.state === 'active' && allOn(ctx, to)) finish(g, ctx, `every connected agent runs ${to}${heldNote(ctx, to)}`);
}

function finish(g: GroupRecord, ctx: GroupCtx, why: string): void {
  g.done_at = new Date(ctx.now).toISOString();
  set(g, ctx, g.back ? 'rolledback' : 'done', why);
  emit(ctx, g.back ? 'autoupdate.rollback' : 'autoupdate.done', g, `group ${g.name} is ${g.back ? 'rolled back' : 'done'}: ${why}`);
}

/** When the group may start (undefined: not yet known), and why it waits. */
export function earliestStart(g: GroupRecord, state: RolloutState, spec: AutoupdateGroup, previous: GroupRecord | undefined, now: number): { at?: number; waits?: string } {
  if (g.forced || g.now) return { at: now };
  if (!previous) return { at: Date.parse(state.created_at) };
  if (previous.state !== 'done' && previous.state !== 'rolledback') return { waits: `waits for group ${previous.name} (${previous.state})` };
  return { at: Date.parse(previous.done_at ?? previous.since) + spec.wait_hours * 3600_000 };
}

function tryStart(g: GroupRecord, ctx: GroupCtx): void {
  const e = earliestStart(g, ctx.state, ctx.spec, ctx.previous, ctx.now);
  if (e.at === undefined) {
    g.reason = e.waits ?? 'waiting';
    return;
  }
  const skip = ctx.skipWindows || g.forced === true || g.now === true;
  // From now on: a window that opened and closed while the group waited is not one it may still start in.
  const at = startAt(ctx.spec, Math.max(e.at, ctx.now), ctx.rules.windowMs, skip);
  if (at === undefined || at > ctx.now) {
    g.reason = at === undefined ? 'its days list no window' : `waits for its window (${new Date(at).toISOString()}, ${ctx.spec.time_zone})`;
    return;
  }
  const { to } = directionOf(ctx.state, g);
  g.started_at = new Date(ctx.now).toISOString();
  const why = g.now ? 'rollback now: every agent at once' : skip ? 'started without waiting for a window' : 'its window opened';
  emit(ctx, 'autoupdate.group_started', g, `group ${g.name} started towards ${to}: ${why}`);
  if (allOn(ctx, to)) return finish(g, ctx, `every connected agent already runs ${to}`);
  const count = g.now ? 0 : ctx.spec.canary_count;
  g.canaries = pickCanaries(ctx, g, count, new Set());
  if (g.canaries.length === 0) set(g, ctx, 'active', count === 0 ? `${why}; no canaries` : `${why}; no agent to be a canary`);
  else set(g, ctx, 'canary', `${why}; ${g.canaries.length} canar${g.canaries.length === 1 ? 'y' : 'ies'} upgrading first`);
}

/** Deterministic: the movable members not on `to` (and not excluded), ordered by hash of rollout id and host id. */
function pickCanaries(ctx: GroupCtx, g: GroupRecord, count: number, exclude: ReadonlySet<string>): CanaryRecord[] {
  const { to } = directionOf(ctx.state, g);
  const at = new Date(ctx.now).toISOString();
  const key = (a: RolloutAgent) => createHash('sha256').update(`${ctx.state.rollout_id}\u0000${a.hostId}`).digest('hex');
  return movable(ctx, to)
    .filter((a) => !sameVersion(a.version, to) && !exclude.has(a.hostId))
    .sort((a, b) => (key(a) < key(b) ? -1 : 1))
    .slice(0, count)
    .map((a) => ({ host_id: a.hostId, nodename: a.nodename, state: 'pending', chosen_at: at, last_seen: at }));
}

/** Why a canary fails now, as a sentence; undefined when it does not. */
export function canaryFailure(c: CanaryRecord, agent: RolloutAgent | undefined, to: string, rules: Rules, now: number): string | undefined {
  const health = agent?.health;
  const upgrader = health?.upgrader;
  if (upgrader && upgrader.result === 'failed' && Date.parse(upgrader.at) >= Date.parse(c.chosen_at)) {
    return `its upgrader reported a failed run${upgrader.code ? ` (${upgrader.code})` : ''}`;
  }
  if (agent && sameVersion(agent.version, to) && freshHealth(agent) && !health!.ok) return `it runs ${to} and reports itself unhealthy (${failedChecks(health!)})`;
  if (c.state !== 'healthy' && now - Date.parse(c.chosen_at) > rules.deadlineMs) {
    return `it was not healthy on ${to} within canary_deadline (${agent ? `runs ${agent.version ?? 'an unknown version'}` : 'no presence'})`;
  }
  return undefined;
}

/** Health measured by the process now connected (after its restart). */
function freshHealth(a: RolloutAgent): boolean {
  return a.health !== undefined && Date.parse(a.health.measured_at) >= Date.parse(a.connectedAt);
}

function failedChecks(h: AgentHealth): string {
  // What an agent says is bounded where its message is read (src/wire/autoupdate.ts); cut again here, since the
  // sentence is stored, audited and printed.
  const failed = h.checks.filter((c) => !c.ok).slice(0, 3).map((c) => `${c.name.slice(0, 64)}${c.detail ? `: ${c.detail.slice(0, 256)}` : ''}`);
  return failed.length > 0 ? `failed check ${failed.join('; ')}` : 'health not ok';
}

function watchCanaries(g: GroupRecord, ctx: GroupCtx): void {
  const { to } = directionOf(ctx.state, g);
  const byId = new Map(ctx.members.map((a) => [a.hostId, a]));
  for (const c of g.canaries) {
    if (c.state === 'gone') continue;
    const agent = byId.get(c.host_id);
    const failure = canaryFailure(c, agent, to, ctx.rules, ctx.now);
    if (failure !== undefined) return halt(g, ctx, c, failure);
    observeCanary(c, agent, g, ctx, to);
  }
  replaceGone(g, ctx);
  const live = g.canaries.filter((c) => c.state !== 'gone');
  if (live.every((c) => c.state === 'healthy')) {
    set(g, ctx, 'active', live.length === 0 ? 'its canaries went away and no agent is left to replace them' : `every canary was healthy on ${to} for canary_healthy_for`);
  }
}

function observeCanary(c: CanaryRecord, agent: RolloutAgent | undefined, g: GroupRecord, ctx: GroupCtx, to: string): void {
  const at = new Date(ctx.now).toISOString();
  if (!agent) {
    if (!c.seen_on_target && ctx.now - Date.parse(c.last_seen) > CANARY_GONE_MS) {
      c.state = 'gone';
      c.detail = 'went away before it reached the target';
    }
    return;
  }
  c.last_seen = at;
  if (!sameVersion(agent.version, to)) {
    c.state = 'upgrading';
    c.detail = `runs ${agent.version ?? 'an unknown version'}`;
    return;
  }
  c.seen_on_target = true;
  if (!freshHealth(agent) || !agent.health!.ok) {
    c.healthy_since = undefined;
    if (c.state !== 'healthy') c.state = 'upgrading';
    c.detail = `runs ${to}, no health measured since its restart yet`;
    return;
  }
  c.healthy_since ??= at;
  if (c.state !== 'healthy' && ctx.now - Date.parse(c.healthy_since) >= ctx.rules.healthyForMs) {
    c.state = 'healthy';
    c.detail = `healthy on ${to} since ${c.healthy_since}`;
    emit(ctx, 'autoupdate.canary_healthy', g, `canary ${c.nodename} (${c.host_id}) of group ${g.name} is healthy on ${to}`, c.host_id);
  } else if (c.state !== 'healthy') {
    c.detail = `healthy on ${to} since ${c.healthy_since}`;
  }
}

function replaceGone(g: GroupRecord, ctx: GroupCtx): void {
  const gone = g.canaries.filter((c) => c.state === 'gone').length;
  const live = g.canaries.length - gone;
  const missing = Math.min(gone, ctx.spec.canary_count - live);
  if (missing <= 0) return;
  const taken = new Set(g.canaries.map((c) => c.host_id));
  const fresh = pickCanaries(ctx, g, missing, taken);
  g.canaries = [...g.canaries.filter((c) => c.state !== 'gone'), ...g.canaries.filter((c) => c.state === 'gone').slice(fresh.length), ...fresh];
}

function halt(g: GroupRecord, ctx: GroupCtx, c: CanaryRecord, failure: string): void {
  const { from } = directionOf(ctx.state, g);
  c.state = 'failed';
  c.detail = failure;
  ctx.state.halts += 1;
  const reason = `canary ${c.nodename} (${c.host_id}) failed: ${failure}; its canaries go back to ${from}`;
  set(g, ctx, 'halted', reason);
  emit(ctx, 'autoupdate.halted', g, `group ${g.name} halted: ${reason}`, c.host_id);
}

/** In a halted group, a canary back on the version it left is rolled back. */
function markRolledBack(g: GroupRecord, ctx: GroupCtx): void {
  const { from } = directionOf(ctx.state, g);
  const byId = new Map(ctx.members.map((a) => [a.hostId, a]));
  for (const c of g.canaries) {
    if (c.state !== 'rolledback' && sameVersion(byId.get(c.host_id)?.version, from)) {
      if (c.state !== 'failed') c.detail = `back on ${from}`;
      c.state = c.state === 'failed' ? 'failed' : 'rolledback';
    }
  }
}

function stepTimeBased(g: GroupRecord, ctx: GroupCtx): void {
  const { to } = directionOf(ctx.state, g);
  if (allOn(ctx, to)) {
    if (g.state !== 'done' && g.state !== 'rolledback') finish(g, ctx, `every connected agent runs ${to}${heldNote(ctx, to)}`);
    return;
  }
  const open = ctx.skipWindows || g.forced === true || g.now === true || windowAt(ctx.spec, ctx.now, ctx.rules.windowMs) !== undefined;
  if (open) {
    if (g.state !== 'active') {
      g.started_at = new Date(ctx.now).toISOString();
      emit(ctx, 'autoupdate.group_started', g, `group ${g.name} started towards ${to}: its window opened`);
    }
    set(g, ctx, 'active', `its window is open: every agent of the group upgrades to ${to}`);
  } else {
    const next = startAt(ctx.spec, ctx.now, ctx.rules.windowMs, false);
    set(g, ctx, 'unstarted', next === undefined ? 'its days list no window' : `waits for its window (${new Date(next).toISOString()}, ${ctx.spec.time_zone})`);
  }
}

export { rolloutId };
