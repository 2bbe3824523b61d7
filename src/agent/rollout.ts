/**
 * The agent's side of a managed rollout (docs/upgrades.md, "Managed rollouts"):
 *
 *   agentUpgradeGroup   its group: gateway.upgrade_group, else the `upgrade-group` label of its SSH Service; sent in
 *                       every tunnel hello (the Proxy keeps it in the presence, the Auth Service places it by it).
 *   upgraderStaleness   pure: whether its upgrader's last run (/etc/gateway-upgrade.d/last-run) is older than
 *                       gateway.upgrade_stale_after, or missing that long after start, and the sentence that says so.
 *   HealthReporter      every heartbeat interval: the agent's own checks (its tunnel, each resource as /readyz
 *                       measures it) and its upgrader's last run, as an AgentHealth; sent over the tunnel when it
 *                       changed (so at most once an interval), and after every welcome (the Proxy keeps the last).
 *                       A stale upgrader is a check named `upgrader` that fails, logged once and counted in
 *                       gateway_agent_upgrade_stale; health.ok stays about serving (the tunnel, the resources):
 *                       a stale timer does not make a canary unhealthy, the rollout lists it apart.
 */
import { logger } from '../log.js';
import { recordUpgradeStale } from '../metrics/upgrade.js';
import type { LastRun } from '../upgrade/lastrun.js';
import { AGENT_HEALTH_DETAIL_MAX, AGENT_HEALTH_MAX_CHECKS, AGENT_HEALTH_NAME_MAX, UPGRADE_GROUP_PATTERN, type AgentHealth } from '../wire/autoupdate.js';

/** The label an agent's SSH Service may carry to name its group when gateway.upgrade_group is not set. */
export const UPGRADE_GROUP_LABEL = 'upgrade-group';
/** The check a stale upgrader fails (not counted in health.ok). */
export const UPGRADER_CHECK = 'upgrader';
/** The systemd timer an operator checks when the upgrader is stale. */
export const UPGRADE_TIMER = 'gateway-upgrade.timer';

/** The group from the config, else the label; a label that is not a group name is no group (and said once). */
export function agentUpgradeGroup(configured: string | undefined, sshLabels: Readonly<Record<string, string>> | undefined): { group?: string; problem?: string } {
  if (configured !== undefined) return { group: configured };
  const label = sshLabels?.[UPGRADE_GROUP_LABEL];
  if (label === undefined) return {};
  if (UPGRADE_GROUP_PATTERN.test(label)) return { group: label };
  return { problem: `the ssh_service label ${UPGRADE_GROUP_LABEL}=${JSON.stringify(label.slice(0, 64))} is not a group name (1 to 32 of a-z, 0-9 and "-"); this agent is in no group (the rollout's catch-all decides)` };
}

export interface Staleness {
  stale: boolean;
  /** One sentence: what the agent sees of its upgrader. */
  detail: string;
}

/**
 * Whether the upgrader is stale at `now` (ms), for an agent started at startedMs. Pure. The detail changes only
 * when the state does (no running counter in it), so the reporter does not resend an unchanged health.
 */
export function upgraderStaleness(lastRun: LastRun | undefined, startedMs: number, now: number, staleAfterMs: number): Staleness {
  const age = `${Math.round(staleAfterMs / 360_000) / 10} h`;
  if (lastRun === undefined) {
    if (now - startedMs < staleAfterMs) return { stale: false, detail: 'no run recorded yet' };
    return { stale: true, detail: `no run of gateway-upgrade recorded since the agent started at ${new Date(startedMs).toISOString()} (over ${age}): check ${UPGRADE_TIMER}` };
  }
  const what = `last run ${new Date(lastRun.at * 1000).toISOString()} (${lastRun.result}${lastRun.code ? ` ${lastRun.code}` : ''})`;
  if (now - lastRun.at * 1000 <= staleAfterMs) return { stale: false, detail: what };
  return { stale: true, detail: `${what}, over ${age} ago: check ${UPGRADE_TIMER}` };
}

const cut = (s: string, max: number) => (s.length > max ? `${s.slice(0, max - 1)}…` : s);

/** The AgentHealth of checks (the tunnel, resources) and the upgrader's state, bounded as the Proxy requires. Pure. */
export function buildHealth(checks: ReadonlyArray<{ name: string; ok: boolean; detail?: string }>, upgrader: { lastRun?: LastRun; staleness?: Staleness }, now: Date): AgentHealth {
  // Room for the upgrader's check: a longer list keeps the first ones (the tunnel comes first).
  const serving = checks.slice(0, AGENT_HEALTH_MAX_CHECKS - 1).map((c) => ({ name: cut(c.name, AGENT_HEALTH_NAME_MAX), ok: c.ok, ...(c.detail ? { detail: cut(c.detail, AGENT_HEALTH_DETAIL_MAX) } : {}) }));
  const all = [...serving];
  if (upgrader.staleness) all.push({ name: UPGRADER_CHECK, ok: !upgrader.staleness.stale, detail: cut(upgrader.staleness.detail, AGENT_HEALTH_DETAIL_MAX) });
  const run = upgrader.lastRun;
  return {
    ok: serving.length > 0 && serving.every((c) => c.ok),
    checks: all,
    measured_at: now.toISOString(),
    ...(run
      ? { upgrader: { result: run.result, at: new Date(run.at * 1000).toISOString(), ...(run.target ? { target: run.target } : {}), ...(run.code ? { code: run.code } : {}) } }
      : {}),
  };
}

/** What changed between two healths, ignoring when they were measured. */
export function sameHealth(a: AgentHealth | undefined, b: AgentHealth): boolean {
  if (!a) return false;
  const strip = (h: AgentHealth) => JSON.stringify({ ...h, measured_at: '' });
  return strip(a) === strip(b);
}

export interface HealthReporterOptions {
  /** Runs the agent's checks (one round) and gives their results. */
  measure: () => Promise<ReadonlyArray<{ name: string; ok: boolean; detail?: string }>>;
  /** Sends a health over every live tunnel. */
  send: (health: AgentHealth) => void;
  /** The upgrader's last run; absent: the host is not enrolled (no upgrader directory), nothing about it is said. */
  readLastRun?: () => LastRun | undefined;
  staleAfterMs: number;
  intervalMs: number;
  now?: () => number;
}

export class HealthReporter {
  private timer: NodeJS.Timeout | undefined;
  private last: AgentHealth | undefined;
  private readonly startedMs: number;
  private warnedStale = false;
  private running: Promise<void> | undefined;
  private readonly now: () => number;
  private readonly log = logger('agent');

  constructor(private readonly options: HealthReporterOptions) {
    this.now = options.now ?? Date.now;
    this.startedMs = this.now();
  }

  start(): void {
    void this.tick();
    this.timer = setInterval(() => void this.tick(), this.options.intervalMs);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }

  /** The last health measured (sent after a welcome), if any. */
  current(): AgentHealth | undefined {
    return this.last;
  }

  /** One measure; sends it when it differs from the last. Rounds never overlap. */
  tick(): Promise<void> {
    this.running ??= this.measureOnce().finally(() => {
      this.running = undefined;
    });
    return this.running;
  }

  private async measureOnce(): Promise<void> {
    const checks = await this.options.measure().catch((err: unknown) => [{ name: 'health', ok: false, detail: (err as Error).message }]);
    const lastRun = this.options.readLastRun?.();
    const staleness = this.options.readLastRun ? upgraderStaleness(lastRun, this.startedMs, this.now(), this.options.staleAfterMs) : undefined;
    if (staleness) {
      recordUpgradeStale(staleness.stale);
      if (staleness.stale && !this.warnedStale) this.log.warn({ detail: staleness.detail, timer: UPGRADE_TIMER }, `the upgrader is stale: ${staleness.detail}`);
      this.warnedStale = staleness.stale;
    }
    const health = buildHealth(checks, { ...(lastRun ? { lastRun } : {}), ...(staleness ? { staleness } : {}) }, new Date(this.now()));
    if (sameHealth(this.last, health)) return;
    this.last = health;
    this.options.send(health);
  }
}
