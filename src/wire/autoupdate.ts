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
