/**
 * The rollout as `gwctl autoupdate status`, `gwctl get autoupdate_agent_rollout` and the Web UI show it, pure:
 * per group its state and reason, its next start in its time zone, its canaries, its connected agents counted by
 * version, and its stale agents (whose upgrader has not run for stale_after: they say so instead of silently
 * never upgrading); agents in no group while the catch-all is disabled are counted apart.
 */
import type { RolloutStatus } from '../../wire/autoupdate.js';
import { earliestStart, membersByGroup, type PlanInput } from './plan.js';
import { groupOf, rulesOf, type RolloutAgent, type Rules } from './state.js';
import { startAt } from './windows.js';

export function statusOf(input: PlanInput): RolloutStatus {
  const { config, version, state } = input;
  if (!config && !version) return { managed: false, groups: [] };
  const rules = rulesOf(config);
  const members = membersByGroup(rules, input.agents);
  const ungrouped = input.agents.filter((a) => groupOf(rules, a.upgradeGroup) === undefined).length;
  const base: RolloutStatus = {
    managed: rules.mode !== 'disabled',
    mode: version?.agents.mode === 'disabled' || rules.mode === 'disabled' ? 'disabled' : version?.agents.mode === 'suspended' || rules.mode === 'suspended' || state?.suspended ? 'suspended' : 'enabled',
    strategy: rules.strategy,
    groups: [],
    ...(ungrouped > 0 || rules.catchAll === undefined ? { ungrouped } : {}),
  };
  if (!version || !state) {
    return { ...base, groups: rules.groups.map((g) => ({ name: g.name, state: 'unstarted', reason: 'nothing upgrades until an operator sets a target (autoupdate_version)', time_zone: g.time_zone, canaries: [], versions: countVersions(members.get(g.name) ?? []), stale: staleOf(rules, members.get(g.name) ?? [], input.now) })) };
  }
  return {
    ...base,
    start_version: state.start_version,
    target_version: state.target_version,
    rollout_id: state.rollout_id,
    ...(state.rollback ? { rollback: state.rollback } : {}),
    groups: state.groups.map((g, i) => {
      const spec = rules.groups[i]!;
      const agents = members.get(g.name) ?? [];
      const next = g.state === 'unstarted' ? nextStart(input, rules, i) : undefined;
      return {
        name: g.name,
        state: g.state,
        reason: g.reason,
        since: g.since,
        ...(next === undefined ? {} : { next_start: new Date(next).toISOString() }),
        time_zone: spec.time_zone,
        canaries: g.canaries.map((c) => ({ host_id: c.host_id, nodename: c.nodename, state: c.state, ...(c.detail ? { detail: c.detail } : {}) })),
        versions: countVersions(agents),
        stale: staleOf(rules, agents, input.now),
      };
    }),
  };
}

function nextStart(input: PlanInput, rules: Rules, i: number): number | undefined {
  const state = input.state!;
  const spec = rules.groups[i]!;
  const skip = input.version!.agents.schedule === 'immediate' || input.version!.agents.critical;
  if (rules.strategy === 'time-based') return startAt(spec, input.now, rules.windowMs, skip);
  const e = earliestStart(state.groups[i]!, state, spec, i > 0 ? state.groups[i - 1] : undefined, input.now);
  return e.at === undefined ? undefined : startAt(spec, Math.max(e.at, input.now), rules.windowMs, skip);
}

function countVersions(agents: readonly RolloutAgent[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const a of agents) {
    const v = a.version ?? 'unknown';
    out[v] = (out[v] ?? 0) + 1;
  }
  return out;
}

/**
 * Agents whose upgrader last ran longer than stale_after ago, or that have reported their health for that long
 * without an upgrader run. Agents of earlier versions report no health: they are not judged.
 */
export function staleOf(rules: Rules, agents: readonly RolloutAgent[], now: number): Array<{ host_id: string; nodename: string; last_run?: string }> {
  const out: Array<{ host_id: string; nodename: string; last_run?: string }> = [];
  for (const a of agents) {
    const run = a.health?.upgrader?.at;
    if (run !== undefined && now - Date.parse(run) > rules.staleAfterMs) out.push({ host_id: a.hostId, nodename: a.nodename, last_run: run });
    else if (a.health && run === undefined && now - Date.parse(a.connectedAt) > rules.staleAfterMs) out.push({ host_id: a.hostId, nodename: a.nodename });
  }
  return out;
}
