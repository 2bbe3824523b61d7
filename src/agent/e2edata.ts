/**
 * The agent's pools of idle data connections for end-to-end streams (src/tunnel/e2e.ts, docs/tunnels.md "End-to-end
 * streams: the agent"). One DataPools per agent process (its tunnels share it: the AgentPool's options), one pool
 * per ADDRESS the v2 tunnels dialled, not per tunnel: behind a load balancer every tunnel of the mesh dialled the
 * same address, and a data connection dialled there lands on whichever Proxy the balancer picks.
 *
 *   attach    a welcomed v2 tunnel registers its Proxy's host ID, its data key (dataKeyOf) and its `size` with the
 *             pool of the address it dialled; detach (its control stream closed) closes the connections waiting
 *             at that Proxy (that Proxy drops them too) and, for the last tunnel of an address, stops the pool.
 *   dial      one dial at a time per address, with the tunnel's Dialer (through HTTPS_PROXY / NO_PROXY exactly as
 *             the tunnel), opened with dataPreamble(the keys of the address's tunnels, newest first, n): n is this
 *             process's one counter, never reused. The Proxy answers `GWDATA1 ok <its host ID>` (read bounded,
 *             within DATA_ANSWER_TIMEOUT_MS): the connection waits at that Proxy. It dials while some tunnel of
 *             the address has fewer than `size` connections waiting at its Proxy. One that lands where `size`
 *             already wait is a SPARE (so is one at a Proxy no tunnel here reaches): kept, and usable there. The
 *             spares are at most the largest `size`: at that bound, while a Proxy is still short, the oldest
 *             spare is closed after a backoff (DATA_RETRY's, its own: reset whenever a dial lands where one was
 *             missing) and the next dial may land where one is missing. So at most (tunnels + 1) × size connections per address, and no dial loop whatever the
 *             balancer does: one that always picks the same Proxy is dialled at the backoff's pace (at most once
 *             per 30 s once it is at its cap) until a connection is used.
 *   retry     a refusal (`GWDATA1 no <reason>`), a bad or missing answer, a failed dial, or an idle connection the
 *             path cut waits DATA_RETRY (src/backoff.ts) before the next dial; landing at a Proxy that already
 *             has enough is not a failure (it is a spare).
 *   idle      a connection idle DATA_IDLE_MAX_MS is closed and replaced (middleboxes cut silent connections; a
 *             data connection has no heartbeat), without counting as a failure
 *   early     the client's first bytes may reach a connection before its e2e-open: they stay unread in the
 *             stream (at most its high-water mark, which holds a ClientHello); without an e2e-open within
 *             DATA_OPEN_WAIT_MS of them the connection is closed (and replaced)
 *   take      an e2e-open on the tunnel to Proxy P naming n takes n only if n's answer named P (a Proxy cannot
 *             claim a connection that waits at another). The e2e-open may overtake the answer (they travel on
 *             different connections): a connection whose answer is still awaited is taken once it comes.
 * Nothing here ever touches a tunnel itself: a data connection's failure costs that connection only.
 */
import type { Duplex } from 'node:stream';
import { Backoff, type BackoffDeps, type BackoffPolicy } from '../backoff.js';
import { toGatewayError } from '../errors.js';
import type { Logger } from '../log.js';
import {
  DATA_ANSWER_MAX_BYTES,
  DATA_ANSWER_TIMEOUT_MS,
  DATA_IDLE_MAX_MS,
  DATA_OPEN_WAIT_MS,
  DATA_TUNNELS_MAX,
  dataPreamble,
  parseDataAnswer,
  type DataAnswer,
} from '../tunnel/e2e.js';

/**
 * The retry of a data connection that failed to dial, was refused, or was closed by the path while idle
 * (docs/retries.md): the first within 0.5-1 s, doubling, capped at 30 s, equal jitter; a connection that stayed
 * idle 10 s resets it.
 */
export const DATA_RETRY: BackoffPolicy = { firstMs: 1_000, maxMs: 30_000, jitter: 'equal', resetAfterMs: 10_000 };

/** What a tunnel's pool takes from the tunnel's options (tests shorten the deadlines). */
export interface DataPoolOptions {
  idleMaxMs?: number;
  openWaitMs?: number;
  answerTimeoutMs?: number;
  backoff?: Partial<BackoffPolicy>;
  backoffDeps?: BackoffDeps;
}

/** What opens a data connection (a Dialer is one). */
export interface DataDialer {
  dial(addr: string): Promise<Duplex>;
}

/** A welcomed v2 tunnel that takes end-to-end streams. */
export interface DataTunnelSpec extends DataPoolOptions {
  /** Opens one data connection: the tunnel's Dialer, or a connection upgrade on the upgrade rung (tunnel.ts dataPathOf). */
  dialer: DataDialer;
  /** The address the tunnel dialled (host:port; with " (connection upgrade)" on the upgrade rung). */
  addr: string;
  /** The host ID of the tunnel's Proxy (its verified certificate). */
  proxyId: string;
  /** dataKeyOf(the tunnel's TLS socket). */
  key: Buffer;
  /** Connections to keep waiting at this tunnel's Proxy. */
  size: number;
  log: Logger;
}

/** A tunnel's view of its address's pool. */
export interface DataTunnelHandle {
  /**
   * Connection n for an e2e-open on this tunnel, if it waits at this tunnel's Proxy (a promise while its answer
   * is awaited); undefined otherwise. The pool refills.
   */
  take(n: number): Duplex | undefined | Promise<Duplex | undefined>;
  /** The numbers of the connections waiting at this tunnel's Proxy. */
  readonly numbers: number[];
  detach(): void;
}

interface Idle {
  socket: Duplex;
  proxyId: string;
  timer: NodeJS.Timeout;
  /** Set once the client's bytes arrived before the e2e-open. */
  early?: NodeJS.Timeout;
  release: () => void;
}

interface Attached {
  proxyId: string;
  key: Buffer;
  size: number;
}

/** The agent process's data connections: one counter, one pool per dialled address. */
export class DataPools {
  private nextN = 1;
  private readonly byAddr = new Map<string, AddressPool>();

  attach(spec: DataTunnelSpec): DataTunnelHandle {
    let pool = this.byAddr.get(spec.addr);
    if (!pool) {
      const created = new AddressPool(spec, () => this.nextN++, () => {
        if (this.byAddr.get(spec.addr) === created) this.byAddr.delete(spec.addr);
      });
      this.byAddr.set(spec.addr, created);
      pool = created;
    }
    const at = pool;
    const tunnel: Attached = { proxyId: spec.proxyId, key: spec.key, size: spec.size };
    at.add(tunnel);
    return {
      take: (n) => at.take(spec.proxyId, n),
      get numbers() {
        return at.numbersAt(spec.proxyId);
      },
      detach: () => at.remove(tunnel),
    };
  }

  /** The pool of an address (tests, status). */
  poolOf(addr: string): AddressPool | undefined {
    return this.byAddr.get(addr);
  }
}

/** The data connections dialled to one address, for the tunnels that dialled it. */
export class AddressPool {
  private readonly tunnels: Attached[] = [];
  private readonly idle = new Map<number, Idle>();
  /** Connections whose answer is awaited, and what an e2e-open that overtook its answer waits on. */
  private readonly pending = new Map<number, Array<(idle: Idle | undefined) => void>>();
  private dialling = false;
  /** A spare is to be closed after the backoff (recycleLater). */
  private recycling = false;
  private stopped = false;
  private readonly retry: Backoff;
  /** The pace of closing spares to redial (recycleLater); reset when a dial lands where one was missing. */
  private readonly recycle: Backoff;
  /** Dials started (tests: no loop). */
  dials = 0;

  constructor(
    private readonly options: DataTunnelSpec,
    private readonly nextN: () => number,
    private readonly onStopped: () => void,
  ) {
    this.retry = new Backoff({ ...DATA_RETRY, ...options.backoff }, { unref: true, ...options.backoffDeps });
    this.recycle = new Backoff({ ...DATA_RETRY, ...options.backoff }, { unref: true, ...options.backoffDeps });
  }

  add(tunnel: Attached): void {
    this.tunnels.push(tunnel);
    // A Proxy that just joined is short: spares are closed for it at the first pace again, not at the pace a
    // balancer that kept sending them elsewhere had reached (a pending slow step is replaced).
    this.recycle.reset();
    this.recycling = false;
    this.fill();
  }

  remove(tunnel: Attached): void {
    const i = this.tunnels.indexOf(tunnel);
    if (i < 0) return;
    this.tunnels.splice(i, 1);
    if (this.tunnels.length === 0) return this.stop();
    if (this.tunnels.some((t) => t.proxyId === tunnel.proxyId)) return;
    // Its Proxy drops them too; not the path's failure, so no backoff.
    for (const [n, entry] of [...this.idle]) {
      if (entry.proxyId !== tunnel.proxyId) continue;
      this.forget(n, entry);
      entry.socket.destroy();
    }
    this.fill();
  }

  /** How many connections wait at each Proxy (tests, logs). */
  get waiting(): Map<string, number> {
    const at = new Map<string, number>();
    for (const e of this.idle.values()) at.set(e.proxyId, (at.get(e.proxyId) ?? 0) + 1);
    return at;
  }

  numbersAt(proxyId: string): number[] {
    return [...this.idle].filter(([, e]) => e.proxyId === proxyId).map(([n]) => n);
  }

  /** The connections beyond `size` at a Proxy, or at a Proxy no tunnel here reaches. */
  get spares(): number {
    let spares = 0;
    for (const [proxyId, count] of this.waiting) {
      const size = Math.max(0, ...this.tunnels.filter((t) => t.proxyId === proxyId).map((t) => t.size));
      spares += Math.max(0, count - size);
    }
    return spares;
  }

  private shortAt(proxyId: string): boolean {
    const count = this.waiting.get(proxyId) ?? 0;
    return this.tunnels.some((t) => t.proxyId === proxyId && count < t.size);
  }

  private get needy(): boolean {
    const waiting = this.waiting;
    return this.tunnels.some((t) => (waiting.get(t.proxyId) ?? 0) < t.size);
  }

  private get spareMax(): number {
    return Math.max(0, ...this.tunnels.map((t) => t.size));
  }

  take(proxyId: string, n: number): Duplex | undefined | Promise<Duplex | undefined> {
    const waiters = this.pending.get(n);
    // At most one claim per tunnel can be honest: more e2e-opens for one pending connection are refused, not kept.
    if (waiters && waiters.length >= DATA_TUNNELS_MAX) return undefined;
    if (waiters) return new Promise((resolve) => waiters.push((idle) => resolve(idle ? this.takeIdle(proxyId, n) : undefined)));
    return this.takeIdle(proxyId, n);
  }

  private takeIdle(proxyId: string, n: number): Duplex | undefined {
    const entry = this.idle.get(n);
    if (!entry) return undefined;
    if (entry.proxyId !== proxyId) {
      this.options.log.warn({ n, from: proxyId, waitsAt: entry.proxyId }, 'an e2e-open names a data connection that waits at another Proxy; refused (it stays idle)');
      return undefined;
    }
    this.forget(n, entry);
    this.retry.up();
    this.fill();
    return entry.socket;
  }

  stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    this.retry.stop();
    this.recycle.stop();
    for (const [n, entry] of [...this.idle]) {
      this.forget(n, entry);
      entry.socket.destroy();
    }
    this.onStopped();
  }

  private fill(): void {
    if (this.stopped || this.dialling || !this.needy) return;
    if (this.spares >= this.spareMax) return this.recycleLater();
    this.dialling = true;
    this.dials++;
    const n = this.nextN();
    // Newest tunnel first: of two tunnels to one Proxy (a hand-over), the Proxy takes the one it routes to.
    const keys = this.tunnels.map((t) => t.key).reverse().slice(0, DATA_TUNNELS_MAX);
    this.pending.set(n, []);
    this.options.dialer.dial(this.options.addr).then(
      (socket) => {
        if (this.stopped) return void this.settle(n, socket, undefined);
        socket.on('error', () => undefined);
        socket.write(dataPreamble(keys, n));
        this.awaitAnswer(socket, (answer, why) => this.answered(n, socket, answer, why));
      },
      (err: unknown) => {
        const e = toGatewayError(err);
        this.options.log.warn({ addr: this.options.addr, n, code: e.code, err: e.message }, 'cannot dial a data connection for end-to-end streams; the tunnel is not affected');
        this.settle(n, undefined, undefined);
        this.retryLater();
      },
    );
  }

  private answered(n: number, socket: Duplex, answer: DataAnswer | undefined, why: string | undefined): void {
    if (this.stopped) return this.settle(n, socket, undefined);
    if (!answer?.ok) {
      this.options.log.warn({ addr: this.options.addr, n, reason: answer ? answer.reason : why }, 'a Proxy refused a data connection, or did not answer it; the next after the backoff');
      this.settle(n, socket, undefined);
      return this.retryLater();
    }
    // Progress: it landed where one was missing, so a spare closed to make room is redialled at the first pace.
    if (this.shortAt(answer.proxy)) this.recycle.reset();
    this.settle(n, socket, this.keep(n, socket, answer.proxy));
    this.fill();
  }

  /** The dial of n is over (socket kept when idle is set); an e2e-open that waited on its answer goes on. */
  private settle(n: number, socket: Duplex | undefined, idle: Idle | undefined): void {
    this.dialling = false;
    if (!idle) socket?.destroy();
    const waiters = this.pending.get(n) ?? [];
    this.pending.delete(n);
    for (const w of waiters) w(idle);
  }

  /** Reads the answer line (at most DATA_ANSWER_MAX_BYTES, within the deadline); bytes behind it stay unread. */
  private awaitAnswer(socket: Duplex, done: (answer: DataAnswer | undefined, why?: string) => void): void {
    let buf = Buffer.alloc(0);
    let over = false;
    const finish = (answer: DataAnswer | undefined, why?: string, rest?: Buffer) => {
      if (over) return;
      over = true;
      clearTimeout(timer);
      socket.off('data', onData);
      socket.off('close', onClose);
      socket.off('end', onClose);
      socket.pause();
      // Only once nothing listens for 'data' any more: unshifted bytes are not this reader's to see again.
      if (rest && rest.length > 0) socket.unshift(rest);
      done(answer, why);
    };
    const onData = (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk]);
      const parsed = parseDataAnswer(buf.subarray(0, DATA_ANSWER_MAX_BYTES));
      if (parsed.kind === 'need-more') return;
      if (parsed.kind === 'bad') return finish(undefined, parsed.why);
      // The client's first bytes may follow at once (the Proxy assigned it to a waiting stream): left unread.
      finish(parsed.answer, undefined, buf.subarray(parsed.length));
    };
    const onClose = () => finish(undefined, 'the connection closed before the Proxy answered');
    const timeoutMs = this.options.answerTimeoutMs ?? DATA_ANSWER_TIMEOUT_MS;
    const timer = setTimeout(() => finish(undefined, `no answer within ${timeoutMs} ms`), timeoutMs);
    timer.unref();
    socket.on('data', onData);
    socket.once('close', onClose);
    socket.once('end', onClose);
    socket.resume(); // a Dialer may hand it over paused
  }

  /**
   * Spares at their bound while a Proxy is short: after a backoff of its own (DATA_RETRY, reset each time a dial
   * lands where one was missing: a balancer that keeps sending them to the same Proxy is dialled ever more slowly,
   * never in a loop; one that spreads them fills the Proxies at the first pace), the oldest spare is closed and the
   * next dial may land where one is missing. One at a time.
   */
  private recycleLater(): void {
    if (this.recycling || this.stopped) return;
    this.recycling = true;
    this.recycle.schedule(() => {
      this.recycling = false;
      const spare = this.oldestSpare();
      if (spare) {
        this.forget(spare[0], spare[1]);
        spare[1].socket.destroy();
      }
      this.fill();
    });
  }

  private oldestSpare(): [number, Idle] | undefined {
    const waiting = this.waiting;
    for (const [n, e] of this.idle) {
      const size = Math.max(0, ...this.tunnels.filter((t) => t.proxyId === e.proxyId).map((t) => t.size));
      if ((waiting.get(e.proxyId) ?? 0) > size) return [n, e];
    }
    return undefined;
  }

  /** After a failure: the next dial after the backoff (one pending retry at a time). */
  private retryLater(): void {
    if (this.stopped) return;
    this.retry.schedule(() => this.fill());
  }

  private keep(n: number, socket: Duplex, proxyId: string): Idle {
    const onGone = (err?: Error) => {
      const entry = this.idle.get(n);
      if (!entry) return;
      this.forget(n, entry);
      socket.destroy();
      this.options.log.info({ n, proxyId, err: err?.message }, 'an idle data connection was closed by the path; replacing it after the backoff');
      this.retryLater();
    };
    const onReadable = () => {
      const entry = this.idle.get(n);
      if (!entry || entry.early) return;
      // 'readable' with nothing buffered is the end of the stream: read() lets 'end' out (onGone).
      if (socket.readableLength === 0) return void socket.read();
      // The client's bytes came before their e2e-open: kept unread, for DATA_OPEN_WAIT_MS at most.
      entry.early = setTimeout(() => {
        if (this.idle.get(n) !== entry) return;
        this.options.log.warn({ n, proxyId, waitMs: this.options.openWaitMs ?? DATA_OPEN_WAIT_MS }, 'a data connection carried bytes but no e2e-open assigned it in time; closing it');
        this.forget(n, entry);
        socket.destroy();
        this.fill();
      }, this.options.openWaitMs ?? DATA_OPEN_WAIT_MS);
      entry.early.unref();
    };
    const timer = setTimeout(() => {
      const entry = this.idle.get(n);
      if (!entry) return;
      this.forget(n, entry);
      socket.destroy();
      this.retry.up(); // it lived its full idle time: not a failure
      this.fill();
    }, this.options.idleMaxMs ?? DATA_IDLE_MAX_MS);
    timer.unref();
    socket.on('error', onGone);
    socket.on('close', onGone);
    socket.on('end', onGone);
    socket.on('readable', onReadable);
    const release = () => {
      socket.off('error', onGone);
      socket.off('close', onGone);
      socket.off('end', onGone);
      socket.off('readable', onReadable);
    };
    const entry: Idle = { socket, proxyId, timer, release };
    this.idle.set(n, entry);
    return entry;
  }

  private forget(n: number, entry: Idle): void {
    this.idle.delete(n);
    clearTimeout(entry.timer);
    if (entry.early) clearTimeout(entry.early);
    entry.release();
  }
}
