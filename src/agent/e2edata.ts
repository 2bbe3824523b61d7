/**
 * The agent's pool of idle data connections for end-to-end streams (src/tunnel/e2e.ts, docs/tunnels.md "End-to-end
 * streams: the agent"): once a v2 tunnel is welcomed, `size` connections to the address that tunnel dialled, each
 * dialled with the tunnel's own Dialer (so through HTTPS_PROXY / NO_PROXY exactly as the tunnel) and opened with
 * dataPreamble(key, n), n = 1, 2, 3... never reused on the tunnel. Then it waits, unread, for the Proxy to assign it
 * (an e2e-open naming n on the tunnel's control stream: take()).
 *
 *   fill      one dial at a time, while idle + dialling < size: a pool never opens more than one connection at
 *             once, and a failed dial (or an idle connection the path cut) waits DATA_RETRY (src/backoff.ts)
 *             before the next, so an unreachable Proxy or a proxy that drops them is never dialled in a loop
 *   idle      a connection idle DATA_IDLE_MAX_MS is closed and replaced (middleboxes cut silent connections; a
 *             data connection has no heartbeat), without counting as a failure
 *   early     the client's first bytes may reach a connection before its e2e-open: they stay unread in the
 *             stream (at most its high-water mark, which holds a ClientHello); without an e2e-open within
 *             DATA_OPEN_WAIT_MS of them the connection is closed (and replaced)
 *   stop      with the tunnel: every idle connection closed, no more dials. Nothing here ever touches the tunnel
 *             itself: a data connection's failure costs that connection only.
 */
import type { Duplex } from 'node:stream';
import { Backoff, type BackoffDeps, type BackoffPolicy } from '../backoff.js';
import type { Dialer } from '../dial/dialer.js';
import { toGatewayError } from '../errors.js';
import type { Logger } from '../log.js';
import { DATA_IDLE_MAX_MS, DATA_OPEN_WAIT_MS, dataPreamble } from '../tunnel/e2e.js';

/**
 * The retry of a data connection that failed to dial, or was closed by the path while idle (docs/retries.md): the
 * first within 0.5-1 s, doubling, capped at 30 s, equal jitter; a connection that stayed idle 10 s resets it.
 */
export const DATA_RETRY: BackoffPolicy = { firstMs: 1_000, maxMs: 30_000, jitter: 'equal', resetAfterMs: 10_000 };

export interface DataPoolOptions {
  dialer: Pick<Dialer, 'dial'>;
  /** The address the tunnel dialled (host:port). */
  addr: string;
  /** dataKeyOf(the tunnel's TLS socket). */
  key: Buffer;
  size: number;
  log: Logger;
  /** Overrides (tests shorten them). */
  idleMaxMs?: number;
  openWaitMs?: number;
  backoff?: Partial<BackoffPolicy>;
  backoffDeps?: BackoffDeps;
}

interface Idle {
  socket: Duplex;
  timer: NodeJS.Timeout;
  /** Set once the client's bytes arrived before the e2e-open. */
  early?: NodeJS.Timeout;
  release: () => void;
}

export class DataPool {
  private nextN = 1;
  private readonly idle = new Map<number, Idle>();
  private dialling = false;
  private stopped = false;
  private readonly retry: Backoff;

  constructor(private readonly options: DataPoolOptions) {
    this.retry = new Backoff({ ...DATA_RETRY, ...options.backoff }, { unref: true, ...options.backoffDeps });
  }

  /** Starts filling the pool. */
  start(): void {
    this.fill();
  }

  /** How many idle connections the pool holds now. */
  get size(): number {
    return this.idle.size;
  }

  /** The numbers of the idle connections (tests, logs). */
  get numbers(): number[] {
    return [...this.idle.keys()];
  }

  /** Takes idle connection n for a stream (the pool refills); undefined when it holds no such connection. */
  take(n: number): Duplex | undefined {
    const entry = this.idle.get(n);
    if (!entry) return undefined;
    this.forget(n, entry);
    this.retry.up();
    this.fill();
    return entry.socket;
  }

  /** Closes every idle connection; no more dials. */
  stop(): void {
    if (this.stopped) return;
    this.stopped = true;
    this.retry.stop();
    for (const [n, entry] of [...this.idle]) {
      this.forget(n, entry);
      entry.socket.destroy();
    }
  }

  private fill(): void {
    if (this.stopped || this.dialling || this.idle.size >= this.options.size) return;
    this.dialling = true;
    const n = this.nextN++;
    this.options.dialer.dial(this.options.addr).then(
      (socket) => {
        this.dialling = false;
        if (this.stopped) return void socket.destroy();
        this.keep(n, socket);
        this.fill();
      },
      (err: unknown) => {
        this.dialling = false;
        const e = toGatewayError(err);
        this.options.log.warn({ addr: this.options.addr, n, code: e.code, err: e.message }, 'cannot dial a data connection for end-to-end streams; the tunnel is not affected');
        this.retryLater();
      },
    );
  }

  /** After a failure: the next dial after the backoff (one pending retry at a time). */
  private retryLater(): void {
    if (this.stopped) return;
    this.retry.schedule(() => this.fill());
  }

  private keep(n: number, socket: Duplex): void {
    socket.write(dataPreamble(this.options.key, n));
    const onGone = (err?: Error) => {
      const entry = this.idle.get(n);
      if (!entry) return;
      this.forget(n, entry);
      socket.destroy();
      this.options.log.info({ n, err: err?.message }, 'an idle data connection was closed by the path; replacing it after the backoff');
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
        this.options.log.warn({ n, waitMs: this.options.openWaitMs ?? DATA_OPEN_WAIT_MS }, 'a data connection carried bytes but no e2e-open assigned it in time; closing it');
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
      // Its errors after this are its stream's to handle; until a handler is attached none may crash the process.
      socket.on('error', () => undefined);
    };
    this.idle.set(n, { socket, timer, release });
  }

  private forget(n: number, entry: Idle): void {
    this.idle.delete(n);
    clearTimeout(entry.timer);
    if (entry.early) clearTimeout(entry.early);
    entry.release();
  }
}
