/**
 * What an operator's command does to the rollout's state, pure (`gwctl autoupdate start|suspend|resume|mark-done|
 * rollback`, POST /v1/autoupdate/<command>): the new state and the event the audit log records. The next step of
 * the planner acts on it (a started group starts at once, a rolled-back one walks back through its canaries).
 */
import { GatewayError } from '../../errors.js';
import { rolloutId, type GroupRecord, type RolloutEvent, type RolloutState } from './state.js';

export const ROLLOUT_COMMANDS = ['start', 'suspend', 'resume', 'mark-done', 'rollback'] as const;
export type RolloutCommand = (typeof ROLLOUT_COMMANDS)[number];

export interface CommandInput {
  command: RolloutCommand;
  group?: string | undefined;
  /** rollback --now: every agent at once, no canaries, no windows. */
  now?: boolean | undefined;
  /** Who asked (the audit's actor, and the reason's). */
  by: string;
}

function groupsOf(state: RolloutState, group: string | undefined): GroupRecord[] {
  if (group === undefined) return state.groups;
  const g = state.groups.find((r) => r.name === group);
  if (!g) throw new GatewayError('GW_ERR_AUTOUPDATE_GROUP', `the rollout has no group ${JSON.stringify(group.slice(0, 64))}`, { hint: `Groups: ${state.groups.map((r) => r.name).join(', ')}.` });
  return [g];
}

function reset(g: GroupRecord, at: string, reason: string): void {
  g.state = 'unstarted';
  g.reason = reason;
  g.since = at;
  g.canaries = [];
  delete g.started_at;
  delete g.done_at;
}

export function applyCommand(current: RolloutState, input: CommandInput, nowMs: number): { state: RolloutState; event: RolloutEvent } {
  const state = structuredClone(current);
  const at = new Date(nowMs).toISOString();
  const event = (type: RolloutEvent['type'], reason: string, group?: string): RolloutEvent => ({ type, rollout_id: state.rollout_id, reason: `${reason} (by ${input.by})`, ...(group ? { group } : {}) });
  switch (input.command) {
    case 'suspend':
      state.suspended = { since: at, by: input.by };
      return { state, event: event('autoupdate.suspended', 'the rollout is suspended: nothing new starts') };
    case 'resume':
      delete state.suspended;
      return { state, event: event('autoupdate.resumed', 'the rollout is resumed') };
    case 'start': {
      // Without --group: the first group not done yet.
      const g = input.group === undefined ? state.groups.find((r) => r.state !== 'done' && r.state !== 'rolledback') : groupsOf(state, input.group)[0];
      if (!g) throw new GatewayError('GW_ERR_AUTOUPDATE_GROUP', 'every group of the rollout is done already', { hint: 'Set a new target_version in autoupdate_version for a new rollout.' });
      if (g.state === 'halted' || g.state === 'done' || g.state === 'rolledback') reset(g, at, 'started again by an operator');
      if (g.state === 'unstarted') g.forced = true;
      return { state, event: event('autoupdate.group_started', `group ${g.name} is started now, without waiting for its window`, g.name) };
    }
    case 'mark-done':
      for (const g of groupsOf(state, input.group)) {
        g.state = g.back ? 'rolledback' : 'done';
        g.reason = `marked ${g.back ? 'rolled back' : 'done'} by ${input.by}`;
        g.since = at;
        g.done_at = at;
      }
      return { state, event: event('autoupdate.done', `${input.group === undefined ? 'every group' : `group ${input.group}`} marked done`, input.group) };
    case 'rollback':
      return rollback(state, input, at, event);
  }
}

function rollback(state: RolloutState, input: CommandInput, at: string, event: (type: RolloutEvent['type'], reason: string, group?: string) => RolloutEvent): { state: RolloutState; event: RolloutEvent } {
  state.generation += 1;
  state.rollout_id = rolloutId(state.start_version, state.target_version, state.generation);
  state.rollback = { since: at, now: input.now === true, ...(input.group === undefined ? {} : { group: input.group }) };
  delete state.suspended;
  for (const g of groupsOf(state, input.group)) {
    reset(g, at, `rolling back to ${state.start_version}`);
    g.back = true;
    delete g.forced;
    if (input.now) g.now = true;
    else delete g.now;
  }
  const what = input.group === undefined ? 'the fleet' : `group ${input.group}`;
  return { state, event: event('autoupdate.rollback', `${what} goes back to ${state.start_version}${input.now ? ' now, all at once' : ' through its groups and canaries'}`, input.group) };
}
