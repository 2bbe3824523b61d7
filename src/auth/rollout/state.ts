/**
 * The managed rollout's inputs and its stored state (one backend key, KEYS.autoupdateRollout), shared by the pure
 * planner (plan.ts), the pure commands (commands.ts) and the controller that stores the state (controller.ts). The
 * resources' effective values (defaults filled in, durations in milliseconds) are read here once.
 */
import { createHash } from 'node:crypto';
import type { AgentHealth, GroupState } from '../../wire/autoupdate.js';
import { durationMs, type AutoupdateConfigSpec, type AutoupdateGroup, type AutoupdateMode, type AutoupdateStrategy, type AutoupdateVersionSpec } from '../resources/index.js';

/** An agent as the planner sees it: its newest presence (written by the Proxy that holds its tunnel). */
export interface RolloutAgent {
  hostId: string;
  nodename: string;
  /** Its software version from its hello; absent for agents of earlier versions. */
  version?: string;
  /** Its group from its hello (its configuration or label); absent: none. */
  upgradeGroup?: string;
  health?: AgentHealth;
  connectedAt: string;
  lastHeartbeat: string;
}

export interface CanaryRecord {
  host_id: string;
  nodename: string;
  state: 'pending' | 'upgrading' | 'healthy' | 'failed' | 'rolledback' | 'gone';
  detail?: string;
  /** When it was chosen: its canary_deadline counts from here. */
  chosen_at: string;
  /** Since when it has been healthy on the target without a break. */
  healthy_since?: string;
  /** It was once seen running the group's version (a canary gone after that is not replaced: its deadline runs). */
  seen_on_target?: boolean;
  /** The last time its presence was seen. */
  last_seen: string;
}

export interface GroupRecord {
  name: string;
  state: GroupState;
  reason: string;
  since: string;
  started_at?: string;
  done_at?: string;
  /** `gwctl autoupdate start`: start now, neither waiting for its window nor for the group before it. */
  forced?: boolean;
  /** Moving back to start_version (a rollback). */
  back?: boolean;
  /** A rollback --now: no canaries, no windows. */
  now?: boolean;
  canaries: CanaryRecord[];
}

export interface RolloutState {
  rollout_id: string;
  start_version: string;
  target_version: string;
  /** Bumped by every rollback: a new rollout_id. */
  generation: number;
  created_at: string;
  suspended?: { since: string; by?: string };
  rollback?: { since: string; now: boolean; group?: string };
  groups: GroupRecord[];
  /** Halts of this rollout so far. */
  halts: number;
}

/** What the audit log records of a step (the controller adds who and when). */
export interface RolloutEvent {
  type: 'autoupdate.group_started' | 'autoupdate.canary_healthy' | 'autoupdate.halted' | 'autoupdate.done' | 'autoupdate.rollback' | 'autoupdate.suspended' | 'autoupdate.resumed';
  rollout_id: string;
  group?: string;
  host_id?: string;
  reason: string;
}

/** The rollout's rules with every default filled in. */
export interface Rules {
  mode: AutoupdateMode;
  strategy: AutoupdateStrategy;
  windowMs: number;
  healthyForMs: number;
  deadlineMs: number;
  staleAfterMs: number;
  /** The group of agents in none; undefined: disabled. */
  catchAll: string | undefined;
  groups: AutoupdateGroup[];
}

/** With no autoupdate_config but a target: one group of every agent, every day from 00:00 UTC, one canary. */
export const DEFAULT_GROUP: AutoupdateGroup = { name: 'default', days: ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'], start_hour: 0, time_zone: 'UTC', wait_hours: 0, canary_count: 1 };

const ms = (text: string, fallback: number): number => durationMs(text) ?? fallback;

export function rulesOf(config: AutoupdateConfigSpec | undefined): Rules {
  const a = config?.agents;
  const groups = a?.schedules.regular.length ? a.schedules.regular : [DEFAULT_GROUP];
  return {
    mode: a?.mode ?? 'enabled',
    strategy: a?.strategy ?? 'halt-on-error',
    windowMs: ms(a?.maintenance_window_duration ?? '1h', 3600_000),
    healthyForMs: ms(a?.canary_healthy_for ?? '5m', 300_000),
    deadlineMs: ms(a?.canary_deadline ?? '30m', 1_800_000),
    staleAfterMs: ms(a?.stale_after ?? '24h', 86_400_000),
    catchAll: a?.catch_all === 'disabled' ? undefined : (a?.catch_all ?? groups[groups.length - 1]!.name),
    groups,
  };
}

/** The group an agent belongs to: the one it names when the config has it, else the catch-all (undefined: none). */
export function groupOf(rules: Rules, named: string | undefined): string | undefined {
  if (named !== undefined && rules.groups.some((g) => g.name === named)) return named;
  return rules.catchAll;
}

export function rolloutId(start: string, target: string, generation: number): string {
  return createHash('sha256').update(`${start}\u0000${target}\u0000${generation}`).digest('hex').slice(0, 12);
}

/** Versions compared without a leading v. */
export function sameVersion(a: string | undefined, b: string | undefined): boolean {
  const bare = (v: string) => (v.startsWith('v') ? v.slice(1) : v);
  return a !== undefined && b !== undefined && bare(a) === bare(b);
}

/** A fresh state for the version resource: every group unstarted. */
export function freshState(version: AutoupdateVersionSpec, rules: Rules, now: number): RolloutState {
  const { start_version: start, target_version: target } = version.agents;
  const at = new Date(now).toISOString();
  return {
    rollout_id: rolloutId(start, target, 0),
    start_version: start,
    target_version: target,
    generation: 0,
    created_at: at,
    groups: rules.groups.map((g) => ({ name: g.name, state: 'unstarted', reason: 'not started yet', since: at, canaries: [] })),
    halts: 0,
  };
}
