/**
 * The managed rollout's contract (issue 28: autoupdate_config / autoupdate_version, groups, canaries), shared by the
 * Auth Service that plans the rollout (src/auth/rollout/), the Proxy that answers agents' upgraders on its public port
 * (src/proxy/), the upgraders that ask (src/upgrade/: gateway-upgrade and the Kubernetes updater), the agents that
 * report their health over the tunnel (src/agent/), gwctl and the Web UI (docs/upgrades.md, "Managed rollouts"):
 *
 *   GET <AUTOUPDATE_AGENT_PATH>?host_id=<uuid>[&group=<name>]   (Proxy's public port, no client certificate: the answer
 *        is only what that host should run; nothing in it is secret, and nothing an asker says changes the rollout)
 *        → 200 application/json AgentInstruction
 *        → 404 from a Proxy of an earlier version: the upgrader keeps the seed's channel behaviour.
 *   The Auth API behind it (a Proxy's identity): GET AUTOUPDATE_AUTH_INSTRUCTION_PATH?host_id=&group=  → the same.
 *   GET /v1/autoupdate/status (a user allowed to read autoupdate_agent_rollout) → RolloutStatus.
 *
 * Pure: paths, shapes, bounds and the parser an upgrader applies to an answer (bounded, every field checked).
 */

export const AUTOUPDATE_AGENT_PATH = '/v1/webapi/autoupdate/agent';
export const AUTOUPDATE_AUTH_INSTRUCTION_PATH = '/v1/autoupdate/instruction';
export const AUTOUPDATE_STATUS_PATH = '/v1/autoupdate/status';
/** The largest instruction an upgrader reads (a real one is a few hundred bytes). */
export const AGENT_INSTRUCTION_MAX_BYTES = 16 * 1024;

/** What one agent (or one Kubernetes updater's release) should run now, and why. */
export interface AgentInstruction {
  /**
   * false: no autoupdate_config / autoupdate_version exists (or the config's mode is disabled): the upgrader keeps the
   * seed's behaviour (channel version server, maintenance windows). true: the fields below decide, the channel does not.
   */
  managed: boolean;
  /** The version this host should run ("17.0.2", no leading v). Absent when managed is false, or nothing is set yet. */
  version?: string;
  /** Install `version` now when the host runs another (an upgrade, or a downgrade for a rollback). */
  update: boolean;
  /** One sentence a command prints: why update is what it is ("canary of group dev", "group prod waits for dev"). */
  reason: string;
  /** The host's group as the rollout placed it ("" when in none and the catch-all is disabled). */
  group?: string;
  /** This host is one of its group's canaries. */
  canary?: boolean;
  /** The release is marked critical (it may skip windows). */
  critical?: boolean;
  /** Identifies the rollout (changes with every new target, start or rollback): reports and logs name it. */
  rollout_id?: string;
  /** When the Auth Service computed this answer (ISO 8601). */
  issued_at?: string;
}

/** A group's state in the rollout. */
export type GroupState = 'unstarted' | 'canary' | 'active' | 'done' | 'halted' | 'rolledback';

/** GET /v1/autoupdate/status: what `gwctl autoupdate status` and the Web UI's agents page show. */
export interface RolloutStatus {
  /** false: no rollout resources; the seed's channels apply. */
  managed: boolean;
  mode?: 'enabled' | 'disabled' | 'suspended';
  strategy?: 'halt-on-error' | 'time-based';
  start_version?: string;
  target_version?: string;
  rollout_id?: string;
  /** A rollback in progress moves agents back to start_version (its groups show the way back). */
  rollback?: { since: string; now: boolean; group?: string };
  groups: Array<{
    name: string;
    state: GroupState;
    /** Why it is in that state, in one sentence (a halt names the canary and the check that failed). */
    reason: string;
    since?: string;
    /** The next time this group may start (its window, in its time zone, as an ISO instant), when unstarted. */
    next_start?: string;
    time_zone?: string;
    canaries: Array<{ host_id: string; nodename: string; state: 'pending' | 'upgrading' | 'healthy' | 'failed' | 'rolledback' | 'gone'; detail?: string }>;
    /** Agents of the group now connected, counted by the version they run. */
    versions: Record<string, number>;
    /** Agents whose upgrader has not run for longer than the stated age (they say so instead of silently waiting). */
    stale: Array<{ host_id: string; nodename: string; last_run?: string }>;
  }>;
  /** Agents in no group while the catch-all is disabled: they never upgrade, and are counted here. */
  ungrouped?: number;
}

/** An agent's own measure of its health (tunnel message `health`, src/tunnel/protocol.ts; kept in its presence). */
export interface AgentHealth {
  ok: boolean;
  /** At most AGENT_HEALTH_MAX_CHECKS; name ≤ 64 characters, detail ≤ 256. */
  checks: Array<{ name: string; ok: boolean; detail?: string }>;
  /** When the agent measured it (ISO 8601). */
  measured_at: string;
  /** The upgrader's last run as the agent read it (/etc/gateway-upgrade.d/last-run, src/upgrade/lastrun.ts). */
  upgrader?: { result: string; at: string; target?: string; code?: string };
}
export const AGENT_HEALTH_MAX_CHECKS = 32;

// --- the pure checks: an upgrader's parse of an instruction, a Proxy's check of an agent's health --------------------

/** A rollout group's name, as an agent's config or label gives it and the hello carries it. */
export const UPGRADE_GROUP_PATTERN = /^[a-z0-9-]{1,32}$/;
export const AGENT_HEALTH_NAME_MAX = 64;
export const AGENT_HEALTH_DETAIL_MAX = 256;
/** How far in the future an agent's measured_at may be (its clock against the Proxy's) before it is refused. */
export const AGENT_HEALTH_FUTURE_SKEW_MS = 5 * 60_000;
const VERSION_TEXT = /^[0-9]{1,9}\.[0-9]{1,9}\.[0-9]{1,9}(?:-[0-9A-Za-z.-]{1,64})?(?:\+[0-9A-Za-z.-]{1,64})?$/;
const ROLLOUT_ID = /^[\x21-\x7e]{1,128}$/;
const REASON_MAX = 512;
const ISO_MAX = 40;

type Fields = Record<string, unknown>;
const isFields = (v: unknown): v is Fields => v !== null && typeof v === 'object' && !Array.isArray(v);
/** Printable text without control characters (a peer's string ends in a terminal and a log). */
const printable = (v: unknown, max: number): v is string => typeof v === 'string' && v.length <= max && !/[\x00-\x1f\x7f]/.test(v);
const isoInstant = (v: unknown): v is string => typeof v === 'string' && v.length <= ISO_MAX && /^\d{4}-\d{2}-\d{2}T/.test(v) && Number.isFinite(Date.parse(v));

/**
 * An instruction's body → the AgentInstruction, or the reason it is not one (the upgrader then does nothing: it
 * never guesses, and never falls back to the channel). Every field is checked for its type and bound; unknown
 * fields (a newer Auth Service's) are ignored. A managed answer that says update must name the version.
 */
export function parseAgentInstruction(body: string): { ok: true; instruction: AgentInstruction } | { ok: false; why: string } {
  if (body.length > AGENT_INSTRUCTION_MAX_BYTES) return { ok: false, why: `the answer is larger than ${AGENT_INSTRUCTION_MAX_BYTES} bytes` };
  let o: unknown;
  try {
    o = JSON.parse(body);
  } catch {
    return { ok: false, why: 'the answer is not JSON' };
  }
  if (!isFields(o)) return { ok: false, why: 'the answer is not a JSON object' };
  if (typeof o.managed !== 'boolean') return { ok: false, why: 'managed is not true or false' };
  if (typeof o.update !== 'boolean') return { ok: false, why: 'update is not true or false' };
  if (!printable(o.reason, REASON_MAX)) return { ok: false, why: `reason is not a line of text of at most ${REASON_MAX} characters` };
  const out: AgentInstruction = { managed: o.managed, update: o.update, reason: o.reason };
  if (o.version !== undefined) {
    if (typeof o.version !== 'string' || !VERSION_TEXT.test(o.version)) return { ok: false, why: 'version is not a version number (x.y.z, no leading v)' };
    out.version = o.version;
  }
  if (o.group !== undefined) {
    if (typeof o.group !== 'string' || (o.group !== '' && !UPGRADE_GROUP_PATTERN.test(o.group))) return { ok: false, why: 'group is not a group name' };
    out.group = o.group;
  }
  for (const k of ['canary', 'critical'] as const) {
    if (o[k] === undefined) continue;
    if (typeof o[k] !== 'boolean') return { ok: false, why: `${k} is not true or false` };
    out[k] = o[k];
  }
  if (o.rollout_id !== undefined) {
    if (typeof o.rollout_id !== 'string' || !ROLLOUT_ID.test(o.rollout_id)) return { ok: false, why: 'rollout_id is not a printable identifier of at most 128 characters' };
    out.rollout_id = o.rollout_id;
  }
  if (o.issued_at !== undefined) {
    if (!isoInstant(o.issued_at)) return { ok: false, why: 'issued_at is not an ISO 8601 time' };
    out.issued_at = o.issued_at;
  }
  if (!out.managed && out.update) return { ok: false, why: 'managed is false but update is true' };
  if (out.managed && out.update && out.version === undefined) return { ok: false, why: 'update is true and no version is named' };
  return { ok: true, instruction: out };
}

/**
 * An agent's health message as a Proxy keeps it (pure): every field typed and bounded (AGENT_HEALTH_MAX_CHECKS
 * checks, names ≤ AGENT_HEALTH_NAME_MAX, details ≤ AGENT_HEALTH_DETAIL_MAX, measured_at a time at most
 * AGENT_HEALTH_FUTURE_SKEW_MS ahead of `now`), rebuilt from the known fields only; or the reason it is refused.
 */
export function checkAgentHealth(value: unknown, now: number): { ok: true; health: AgentHealth } | { ok: false; why: string } {
  if (!isFields(value)) return { ok: false, why: 'health is not an object' };
  if (typeof value.ok !== 'boolean') return { ok: false, why: 'ok is not true or false' };
  if (!Array.isArray(value.checks)) return { ok: false, why: 'checks is not a list' };
  if (value.checks.length > AGENT_HEALTH_MAX_CHECKS) return { ok: false, why: `${value.checks.length} checks, more than ${AGENT_HEALTH_MAX_CHECKS}` };
  if (!isoInstant(value.measured_at)) return { ok: false, why: 'measured_at is not an ISO 8601 time' };
  const measured = Date.parse(value.measured_at);
  if (measured > now + AGENT_HEALTH_FUTURE_SKEW_MS) return { ok: false, why: `measured_at ${value.measured_at} is in the future` };
  const checks: AgentHealth['checks'] = [];
  for (const c of value.checks as unknown[]) {
    if (!isFields(c) || typeof c.ok !== 'boolean') return { ok: false, why: 'a check is not {name, ok, detail}' };
    if (!printable(c.name, AGENT_HEALTH_NAME_MAX) || c.name === '') return { ok: false, why: `a check's name is not text of 1 to ${AGENT_HEALTH_NAME_MAX} characters` };
    if (c.detail !== undefined && !printable(c.detail, AGENT_HEALTH_DETAIL_MAX)) return { ok: false, why: `check ${c.name}: detail is not text of at most ${AGENT_HEALTH_DETAIL_MAX} characters` };
    checks.push({ name: c.name, ok: c.ok, ...(c.detail === undefined ? {} : { detail: c.detail }) });
  }
  const health: AgentHealth = { ok: value.ok, checks, measured_at: new Date(measured).toISOString() };
  if (value.upgrader !== undefined) {
    const u = value.upgrader;
    if (!isFields(u) || !printable(u.result, 32) || !isoInstant(u.at)) return { ok: false, why: 'upgrader is not {result, at, target, code}' };
    if (u.target !== undefined && (typeof u.target !== 'string' || !VERSION_TEXT.test(u.target))) return { ok: false, why: 'upgrader.target is not a version' };
    if (u.code !== undefined && (typeof u.code !== 'string' || !/^GW_ERR_[A-Z0-9_]{1,64}$/.test(u.code))) return { ok: false, why: 'upgrader.code is not an error code' };
    health.upgrader = { result: u.result, at: u.at, ...(u.target === undefined ? {} : { target: u.target }), ...(u.code === undefined ? {} : { code: u.code }) };
  }
  return { ok: true, health };
}
