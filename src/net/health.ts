/**
 * Readiness as a schedule of checks (what /readyz of gateway.diag_addr answers, src/net/diag.ts): each role names
 * the checks that say it can do its job (src/roles/health.ts), and this file runs them, all at once, every
 * intervalMs (5 s by default), each bounded by its own deadline (timeoutMs, below the interval), and keeps the last
 * result of each. A request to /readyz reads those results and runs nothing: a flood of probes never reaches the
 * backend, a database or an agent's resources; the checks' own rate is one round per interval whatever is asked.
 *
 * A dependency that fails is seen by the next round, and a round ends within its deadline, so /readyz turns
 * unready at most intervalMs + timeoutMs after the failure (under two intervals), and ready again as quickly
 * after the recovery. A round never overlaps the previous one (a check that hangs past its deadline is counted
 * failed and left behind; its late answer is dropped).
 *
 * `since` is when the check's result last changed (ok to failing or back, or its detail while failing), so an
 * operator sees for how long it has been failing.
 */

export interface HealthCheck {
  /** Stable, names what is checked ("backend", "auth", "listener web", "tunnel", "db pg1"). */
  name: string;
  /** Resolves with a detail when healthy (may be empty), rejects with why not. */
  run(): Promise<string | void>;
}

export interface CheckResult {
  name: string;
  ok: boolean;
  /** What was seen: the failure's message, or a note on success. */
  detail: string;
  /** ISO time the result last changed. */
  since: string;
}

export interface ReadyReport {
  status: 'ready' | 'not ready';
  checks: CheckResult[];
}

export interface HealthOptions {
  intervalMs?: number;
  /** Each check's deadline; kept below the interval. */
  timeoutMs?: number;
  now?: () => Date;
}

export const HEALTH_INTERVAL_MS = 5_000;
export const HEALTH_TIMEOUT_MS = 3_000;
/** The longest detail kept (a failure's message from a peer is not trusted to be short). */
const DETAIL_MAX = 300;

export class HealthMonitor {
  private readonly results = new Map<string, CheckResult>();
  /** The checks that have run at least once. */
  private readonly checked = new Set<string>();
  private timer: NodeJS.Timeout | undefined;
  private round: Promise<void> | undefined;
  private readonly intervalMs: number;
  private readonly timeoutMs: number;
  private readonly now: () => Date;

  constructor(
    private readonly checks: readonly HealthCheck[],
    options: HealthOptions = {},
  ) {
    this.intervalMs = options.intervalMs ?? HEALTH_INTERVAL_MS;
    this.timeoutMs = Math.min(options.timeoutMs ?? HEALTH_TIMEOUT_MS, this.intervalMs);
    this.now = options.now ?? (() => new Date());
    const at = this.now().toISOString();
    // Until the first round ends, every check is "not yet run": not ready.
    for (const c of checks) this.results.set(c.name, { name: c.name, ok: false, detail: 'not checked yet', since: at });
  }

  /** Runs a first round now, then one every interval. Resolves once the first round has ended. */
  start(): Promise<void> {
    if (!this.timer) {
      this.timer = setInterval(() => void this.runRound(), this.intervalMs);
      this.timer.unref();
    }
    return this.runRound();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }

  /** The last results; ready when every check passed (no check: ready). */
  report(): ReadyReport {
    const checks = this.checks.map((c) => ({ ...this.results.get(c.name)! }));
    return { status: checks.every((c) => c.ok) ? 'ready' : 'not ready', checks };
  }

  /** One round: every check at once, each within the deadline; skipped while the previous round runs. */
  runRound(): Promise<void> {
    this.round ??= Promise.all(this.checks.map((c) => this.runOne(c))).then(() => {
      this.round = undefined;
    });
    return this.round;
  }

  private async runOne(check: HealthCheck): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`no answer within ${this.timeoutMs} ms`)), this.timeoutMs);
    });
    let ok: boolean;
    let detail: string;
    try {
      const note = await Promise.race([Promise.resolve().then(() => check.run()), deadline]);
      ok = true;
      detail = typeof note === 'string' ? note : '';
    } catch (err) {
      ok = false;
      detail = err instanceof Error ? err.message : String(err);
    } finally {
      clearTimeout(timer);
    }
    detail = detail.length > DETAIL_MAX ? `${detail.slice(0, DETAIL_MAX)}…` : detail;
    const last = this.results.get(check.name)!;
    const changed = last.ok !== ok || (!ok && last.detail !== detail) || !this.checked.has(check.name);
    this.checked.add(check.name);
    this.results.set(check.name, { name: check.name, ok, detail, since: changed ? this.now().toISOString() : last.since });
  }
}
