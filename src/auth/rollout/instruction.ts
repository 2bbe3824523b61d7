/**
 * What one agent (or one Kubernetes updater's release) should run now, and why: read from the planner's state,
 * pure. The agent's group is the one its presence carries (what its Proxy confirmed); only for an agent with no
 * presence is the group its upgrader names in the query taken, and that choice changes nothing but the answer:
 * nothing an asker says moves the rollout (src/wire/autoupdate.ts).
 */
import type { AgentInstruction } from '../../wire/autoupdate.js';
import { directionOf, earliestStart } from './plan.js';
import { versionHold } from './safety.js';
import { groupOf, rulesOf } from './state.js';
import type { PlanInput } from './plan.js';
import { startAt } from './windows.js';

export const NOT_MANAGED_REASON = 'no autoupdate_config or autoupdate_version exists: the channels and maintenance windows apply';

export function instructionFor(input: PlanInput, hostId: string, queryGroup?: string): AgentInstruction {
  const { config, version, state, now } = input;
  const issued_at = new Date(now).toISOString();
  if (!config && !version) return { managed: false, update: false, reason: NOT_MANAGED_REASON, issued_at };
  const rules = rulesOf(config);
  if (rules.mode === 'disabled') return { managed: false, update: false, reason: "autoupdate_config's mode is disabled: the channels and maintenance windows apply", issued_at };
  if (!version) return { managed: true, update: false, reason: 'nothing upgrades until an operator sets a target (autoupdate_version)', issued_at };
  if (!state) return { managed: true, update: false, reason: 'the Auth Service has not planned the new target yet: ask again shortly', issued_at };
  const agent = input.agents.find((a) => a.hostId === hostId);
  const group = groupOf(rules, agent ? agent.upgradeGroup : queryGroup);
  const base = { managed: true, rollout_id: state.rollout_id, issued_at, ...(version.agents.critical ? { critical: true } : {}) };
  if (group === undefined) return { ...base, update: false, group: '', reason: 'in no group and catch_all is disabled: it never upgrades' };
  const g = state.groups.find((r) => r.name === group);
  if (!g) return { ...base, update: false, group, reason: `group ${group} is not in the rollout yet` };
  const { to, from } = directionOf(state, g);
  const stay = { ...base, group, version: from, update: false };
  if (version.agents.mode === 'disabled') return { ...stay, reason: "autoupdate_version's mode is disabled: no agent is told to update" };
  if (rules.mode === 'suspended' || version.agents.mode === 'suspended' || state.suspended) return { ...stay, reason: 'the rollout is suspended: nothing new starts until it is resumed' };
  const canary = g.canaries.find((c) => c.host_id === hostId && c.state !== 'gone');
  if (g.state === 'halted') {
    return canary ? { ...base, group, version: from, update: true, canary: true, reason: `group ${g.name} halted (${g.reason}): this canary goes back to ${from}` } : { ...stay, reason: `group ${g.name} halted: ${g.reason}` };
  }
  const hold = versionHold(to, agent?.version, input.controlPlane);
  if (hold !== undefined) return { ...stay, version: agent?.version ?? from, reason: hold };
  const go = { ...base, group, version: to, update: true };
  switch (g.state) {
    case 'canary':
      return canary ? { ...go, canary: true, reason: `canary of group ${g.name}: upgrades to ${to} first` } : { ...stay, reason: `group ${g.name} waits for its canaries` };
    case 'active':
      return { ...go, reason: `group ${g.name} is active: ${to}` };
    case 'done':
    case 'rolledback':
      return { ...go, reason: `group ${g.name} is ${g.state === 'done' ? 'done' : 'rolled back'}: ${to}` };
    default:
      return { ...stay, reason: `group ${g.name} has not started: ${waitReason(input, group)}` };
  }
}

/** Why an unstarted group waits (the group before it, or its next window). */
function waitReason(input: PlanInput, group: string): string {
  const state = input.state!;
  const rules = rulesOf(input.config);
  const i = rules.groups.findIndex((g) => g.name === group);
  const g = state.groups[i]!;
  if (rules.strategy === 'time-based') return g.reason;
  const e = earliestStart(g, state, rules.groups[i]!, i > 0 ? state.groups[i - 1] : undefined, input.now);
  if (e.at === undefined) return e.waits ?? g.reason;
  const skip = input.version!.agents.schedule === 'immediate' || input.version!.agents.critical;
  const at = startAt(rules.groups[i]!, Math.max(e.at, input.now), rules.windowMs, skip);
  return at === undefined ? 'its days list no window' : `its next start is ${new Date(at).toISOString()} (${rules.groups[i]!.time_zone})`;
}
