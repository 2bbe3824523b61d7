/**
 * Failed-login limiter: after `maxFailures` wrong passwords for one (user, source) within `windowMs`, further
 * attempts from that source for that user are refused until the oldest failure leaves the window. The table is
 * bounded (oldest keys are evicted first) so a flood of made-up user names cannot grow memory without end.
 */
export interface RateLimiterOptions {
  maxFailures?: number;
  windowMs?: number;
  maxKeys?: number;
  clock?: () => number;
}

export class LoginRateLimiter {
  private readonly failures = new Map<string, number[]>();
  private readonly maxFailures: number;
  private readonly windowMs: number;
  private readonly maxKeys: number;
  private readonly clock: () => number;

  constructor(options: RateLimiterOptions = {}) {
    this.maxFailures = options.maxFailures ?? 5;
    this.windowMs = options.windowMs ?? 5 * 60_000;
    this.maxKeys = options.maxKeys ?? 100_000;
    this.clock = options.clock ?? Date.now;
  }

  private recent(key: string): number[] {
    const now = this.clock();
    const list = (this.failures.get(key) ?? []).filter((t) => now - t < this.windowMs);
    if (list.length === 0) this.failures.delete(key);
    else this.failures.set(key, list);
    return list;
  }

  /** Milliseconds to wait before the next attempt is allowed, or 0. */
  retryAfterMs(user: string, source: string): number {
    const list = this.recent(`${user}\u0000${source}`);
    if (list.length < this.maxFailures) return 0;
    return Math.max(1, list[0]! + this.windowMs - this.clock());
  }

  recordFailure(user: string, source: string): void {
    const key = `${user}\u0000${source}`;
    const list = this.recent(key);
    list.push(this.clock());
    this.failures.delete(key); // re-insert: Map order is our eviction order
    this.failures.set(key, list);
    while (this.failures.size > this.maxKeys) this.failures.delete(this.failures.keys().next().value!);
  }

  recordSuccess(user: string, source: string): void {
    this.failures.delete(`${user}\u0000${source}`);
  }
}
