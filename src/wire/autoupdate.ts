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
import { GatewayError } from '../errors.js';

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

/** A rollout group's name (an agent's gateway.upgrade_group, the chart's updater.group). */
export const UPGRADE_GROUP_PATTERN = /^[a-z0-9-]{1,32}$/;
/** A version as an instruction names it: x.y.z[-pre], no leading v (the metrics' version labels take the same). */
const INSTRUCTION_VERSION = /^[0-9]{1,4}\.[0-9]{1,4}\.[0-9]{1,4}(?:-[0-9A-Za-z.]{1,32})?$/;
const ROLLOUT_ID = /^[A-Za-z0-9._:-]{1,128}$/;
const REASON_MAX = 512;

function instructionError(message: string): GatewayError {
  return new GatewayError('GW_ERR_AUTOUPDATE_INSTRUCTION', `the rollout instruction is unreadable: ${message}`);
}

/**
 * An upgrader's strict reading of an AgentInstruction (the body of a 200): bounded (AGENT_INSTRUCTION_MAX_BYTES),
 * every field of the contract checked for its type and shape, fields it does not know ignored (a newer Proxy may add
 * optional ones). A managed:false answer may not ask for an update, and update:true needs a version: an answer that
 * would make an upgrader act without saying to what is refused. GW_ERR_AUTOUPDATE_INSTRUCTION names the field.
 */
export function parseAgentInstruction(text: string): AgentInstruction {
  if (Buffer.byteLength(text) > AGENT_INSTRUCTION_MAX_BYTES) throw instructionError(`it is over ${AGENT_INSTRUCTION_MAX_BYTES} bytes`);
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    throw instructionError('it is not JSON');
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw instructionError('it is not a JSON object');
  const o = raw as Record<string, unknown>;
  const field = (name: string, ok: boolean, expected: string): void => {
    if (!ok) throw instructionError(`${name} is ${JSON.stringify(o[name])?.slice(0, 40) ?? 'missing'}, not ${expected}`);
  };
  const optional = (name: string, check: (v: unknown) => boolean, expected: string): void => field(name, o[name] === undefined || check(o[name]), expected);
  field('managed', typeof o.managed === 'boolean', 'a boolean');
  field('update', typeof o.update === 'boolean', 'a boolean');
  field('reason', typeof o.reason === 'string' && o.reason.length <= REASON_MAX, `a string of at most ${REASON_MAX} characters`);
  optional('version', (v) => typeof v === 'string' && INSTRUCTION_VERSION.test(v), 'a version x.y.z[-pre] without a leading v');
  optional('group', (v) => v === '' || (typeof v === 'string' && UPGRADE_GROUP_PATTERN.test(v)), 'a group name ([a-z0-9-]{1,32}) or ""');
  optional('canary', (v) => typeof v === 'boolean', 'a boolean');
  optional('critical', (v) => typeof v === 'boolean', 'a boolean');
  optional('rollout_id', (v) => typeof v === 'string' && ROLLOUT_ID.test(v), 'a rollout id ([A-Za-z0-9._:-]{1,128})');
  optional('issued_at', (v) => typeof v === 'string' && v.length <= 64 && !Number.isNaN(Date.parse(v)), 'an ISO 8601 time');
  if (o.managed === false && o.update === true) throw instructionError('managed is false but update is true');
  if (o.update === true && o.version === undefined) throw instructionError('update is true but no version is named');
  const out: AgentInstruction = { managed: o.managed as boolean, update: o.update as boolean, reason: o.reason as string };
  for (const k of ['version', 'group', 'canary', 'critical', 'rollout_id', 'issued_at'] as const) {
    if (o[k] !== undefined) (out as unknown as Record<string, unknown>)[k] = o[k];
  }
  return out;
}
