/**
 * The agents' data connections for end-to-end streams, at the Proxy (the contract: src/tunnel/e2e.ts; the prose:
 * docs/tunnels.md, "End-to-end streams: the Proxy"). The one file that decides which data connection is taken.
 *
 *   attach     a v2 tunnel whose hello carried the e2e capability is welcomed (tunnel.ts): its data key is
 *              derived from the tunnel's TLS session (dataKeyOf) and the tunnel is registered by the key's id
 *              (kid) and by its agent's host ID (the newest tunnel of an agent wins); when it closes, it leaves
 *              both and its idle data connections are closed.
 *   handle     the route gateway-data (sniffed `GWDATA1 `, not TLS): the preamble line is read incrementally,
 *              at most DATA_PREAMBLE_MAX_BYTES and within DATA_PREAMBLE_TIMEOUT_MS; then the first of its pairs
 *              whose kid is a tunnel of this Proxy (behind a load balancer the agent cannot know which Proxy it
 *              reaches, so it sends one pair per tunnel), that pair's MAC (checkDataPreamble), n not used before on
 *              that tunnel (n is the agent's one counter, so per tunnel increasing but sparse: a window of
 *              DATA_N_WINDOW numbers below the highest seen, anything older refused too), and room in the
 *              tunnel's pool (at most min(2 × capability pool, DATA_POOL_MAX) idle: the agent's pool and the
 *              spares a balancer sends). Admitted, it is answered `GWDATA1 ok <this Proxy's host ID>` before
 *              anything else is written on it (the agent then knows where it waits); refused, `GWDATA1 no
 *              <reason>` (when a preamble came) and the end. A refusal is counted and logged (GW_ERR_E2E_DATA) at
 *              most once per DATA_LOG_GAP_MS per reason. The answer goes to the agent only: a client's stream is
 *              spliced onto the connection after it.
 *   idle       nothing is read from an idle data connection for the stream: it is watched only for bytes or an
 *              end; bytes while idle close it (the agent sends nothing before it is assigned), an end drops it.
 *   take       the relay (e2erelay.ts) takes the oldest idle data connection of an agent's current tunnel, waiting
 *              up to a deadline for one to arrive (none for an agent that takes streams on its tunnel: the relay
 *              opens a tunnel stream at once); the caller then sends the tunnel's control message and splices.
 */
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import { logger, type Logger } from '../log.js';
import { clientOf, type ConnInfo } from '../mux/multiplexer.js';
import { recordDataRefused, watchIdleData, type DataRefusal } from '../metrics/e2e.js';
import {
  checkDataPreamble,
  dataKeyId,
  dataKeyOf,
  DATA_POOL_MAX,
  DATA_PREAMBLE_MAX_BYTES,
  DATA_PREAMBLE_TIMEOUT_MS,
  dataAnswer,
  parseDataPreamble,
  type DataPreamble,
  type E2ECapability,
  type E2EOpenMessage,
} from '../tunnel/e2e.js';

/** How far below the highest number seen on a tunnel a data connection's number is still remembered. */
export const DATA_N_WINDOW = 4096;
/** A refused data connection's answer line gets this long to reach the agent before the connection is cut. */
export const DATA_REFUSE_FLUSH_MS = 1_000;
/** A refusal reason is logged at most once per this long (a flood costs a counter, not a log line each). */
export const DATA_LOG_GAP_MS = 10_000;

/** What tunnel.ts hands over for a welcomed v2 tunnel with the e2e capability. */
export interface DataTunnelSpec {
  hostId: string;
  nodename: string;
  socket: TLSSocket;
  capability: E2ECapability;
  /** Writes one control message on the tunnel's control stream. */
  send(message: E2EOpenMessage): void;
  /** Opens a stream of the tunnel (what carries an end-to-end stream when no data connection waits: capability.stream). */
  openStream(): Promise<Duplex>;
  /** fn runs once the tunnel is gone. */
  onGone(fn: () => void): void;
}

/** An agent's tunnel as the relay sees it. */
export interface DataTunnel {
  readonly hostId: string;
  readonly nodename: string;
  readonly kid: string;
  /** The agent takes an end-to-end stream on a tunnel stream (its hello's e2e.stream). */
  readonly tunnelStreams: boolean;
  send(message: E2EOpenMessage): void;
  openStream(): Promise<Duplex>;
}

interface Idle {
  n: number;
  stream: Duplex;
  /** Stops watching it (before it is handed out). */
  unwatch(): void;
}

interface Entry extends DataTunnel {
  key: Buffer;
  pool: number;
  idle: Idle[];
  /** Numbers used at or above floor; the highest seen. */
  used: Set<number>;
  highest: number;
  waiters: Array<(idle: Idle | undefined) => void>;
  gone: boolean;
}

export interface DataConnectionsOptions {
  /** This Proxy's host ID: the answer to an admitted data connection names it. */
  proxyId: string;
  preambleTimeoutMs?: number;
}

export class DataConnections {
  private readonly byKid = new Map<string, Entry>();
  private readonly byHost = new Map<string, Entry>();
  private readonly log: Logger = logger('e2e-data');
  private readonly lastLogged = new Map<DataRefusal, number>();
  private readonly preambleTimeoutMs: number;
  private readonly unwatch: () => void;

  private readonly proxyId: string;

  constructor(options: DataConnectionsOptions) {
    this.proxyId = options.proxyId;
    this.preambleTimeoutMs = options.preambleTimeoutMs ?? DATA_PREAMBLE_TIMEOUT_MS;
    this.unwatch = watchIdleData(() => this.idleCount());
  }

  /** A welcomed v2 tunnel with the e2e capability (a new tunnel of the same agent replaces it by host ID). */
  attach(spec: DataTunnelSpec): void {
    const key = dataKeyOf(spec.socket);
    const entry: Entry = {
      hostId: spec.hostId,
      nodename: spec.nodename,
      kid: dataKeyId(key),
      key,
      pool: Math.min(2 * spec.capability.pool, DATA_POOL_MAX),
      tunnelStreams: spec.capability.stream === true,
      send: spec.send,
      openStream: spec.openStream,
      idle: [],
      used: new Set(),
      highest: 0,
      waiters: [],
      gone: false,
    };
    this.byKid.set(entry.kid, entry);
    this.byHost.set(entry.hostId, entry);
    spec.onGone(() => this.detach(entry));
  }

  /** The agent's current tunnel that takes end-to-end streams here, if any. */
  tunnelOf(hostId: string): DataTunnel | undefined {
    return this.byHost.get(hostId);
  }

  idleCount(): number {
    let n = 0;
    for (const e of this.byKid.values()) n += e.idle.length;
    return n;
  }

  /** Idle data connections of the tunnel an agent holds here (tests, `gateway` status). */
  idleOf(hostId: string): number {
    return this.byHost.get(hostId)?.idle.length ?? 0;
  }

  /**
   * The oldest idle data connection of `tunnel`, or the first to arrive within waitMs (0: only one idle now);
   * undefined when none did (or the tunnel closed meanwhile). The stream is no longer watched: the caller splices
   * it at once.
   */
  take(tunnel: DataTunnel, waitMs: number): Promise<{ n: number; stream: Duplex } | undefined> {
    const entry = this.byKid.get(tunnel.kid);
    if (!entry || entry.gone) return Promise.resolve(undefined);
    const ready = entry.idle.shift();
    if (ready) return Promise.resolve(handOut(ready));
    if (waitMs <= 0) return Promise.resolve(undefined);
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        entry.waiters = entry.waiters.filter((w) => w !== waiter);
        resolve(undefined);
      }, waitMs);
      const waiter = (idle: Idle | undefined) => {
        clearTimeout(timer);
        resolve(idle ? handOut(idle) : undefined);
      };
      entry.waiters.push(waiter);
    });
  }

  /** The route gateway-data: a data connection's preamble, then into its tunnel's pool (or closed). */
  handle = (stream: Duplex, info: ConnInfo): void => {
    let buf = Buffer.alloc(0);
    const done = () => {
      clearTimeout(timer);
      stream.off('data', onData);
      stream.off('close', onClose);
    };
    const timer = setTimeout(() => {
      done();
      this.refuse(stream, info, 'timeout', `no data preamble within ${this.preambleTimeoutMs} ms`, false);
    }, this.preambleTimeoutMs);
    const onClose = () => done();
    const onData = (chunk: Buffer) => {
      // Only the head is kept: the parser looks at DATA_PREAMBLE_MAX_BYTES at most.
      buf = Buffer.concat([buf, chunk]).subarray(0, DATA_PREAMBLE_MAX_BYTES + 1);
      const parsed = parseDataPreamble(buf);
      if (parsed.kind === 'need-more') return;
      done();
      stream.pause();
      if (parsed.kind === 'bad') return this.refuse(stream, info, 'bad-preamble', parsed.why, true);
      // Bytes behind the preamble: the agent sent before it was assigned.
      if (buf.length > parsed.length) {
        return this.refuse(stream, info, 'bytes-while-idle', 'the data connection sent bytes behind its preamble before it was assigned', true);
      }
      this.admit(stream, info, parsed);
    };
    stream.on('data', onData);
    stream.once('close', onClose);
    stream.on('error', () => stream.destroy());
  };

  /** The first pair that names a tunnel of this Proxy decides; the others are other Proxies' (not checked here). */
  private admit(stream: Duplex, info: ConnInfo, p: DataPreamble): void {
    const n = p.n;
    const entry = p.pairs.map((pair) => this.byKid.get(pair.kid)).find((e) => e !== undefined && !e.gone);
    if (!entry) return this.refuse(stream, info, 'unknown-tunnel', `no tunnel of this Proxy has any of the data keys ${p.pairs.map((pair) => pair.kid).join(', ')}`, true);
    if (!checkDataPreamble(entry.key, p)) return this.refuse(stream, info, 'bad-mac', `the data preamble's MAC is not the tunnel's (agent ${entry.hostId})`, true);
    if (entry.used.has(n) || n <= entry.highest - DATA_N_WINDOW) return this.refuse(stream, info, 'reused', `data connection ${n} of agent ${entry.hostId} was used before`, true);
    const waiter = entry.waiters.shift();
    if (!waiter && entry.idle.length >= entry.pool) {
      return this.refuse(stream, info, 'pool-full', `agent ${entry.hostId} already has ${entry.pool} idle data connections here`, true);
    }
    this.remember(entry, n);
    // The answer is the first byte the agent reads; a client's stream is spliced on after it.
    stream.write(dataAnswer({ ok: true, proxy: this.proxyId }));
    const idle = this.watch(entry, n, stream, info);
    if (waiter) return waiter(idle);
    entry.idle.push(idle);
  }

  private remember(entry: Entry, n: number): void {
    entry.used.add(n);
    if (n > entry.highest) entry.highest = n;
    if (entry.used.size <= DATA_N_WINDOW) return;
    const floor = entry.highest - DATA_N_WINDOW;
    for (const u of entry.used) if (u <= floor) entry.used.delete(u);
  }

  /** Idle: any byte closes it, an end or a close drops it; nothing is consumed for the stream. */
  private watch(entry: Entry, n: number, stream: Duplex, info: ConnInfo): Idle {
    const drop = () => {
      entry.idle = entry.idle.filter((i) => i !== idle);
    };
    const onReadable = () => {
      unwatch();
      drop();
      if (stream.readableLength > 0) return this.refuse(stream, info, 'bytes-while-idle', `data connection ${n} of agent ${entry.hostId} sent bytes while idle`, false);
      stream.destroy();
    };
    const onClose = () => {
      unwatch();
      drop();
    };
    const unwatch = () => {
      stream.off('readable', onReadable);
      stream.off('close', onClose);
    };
    const idle: Idle = { n, stream, unwatch };
    stream.on('readable', onReadable);
    stream.once('close', onClose);
    return idle;
  }

  private detach(entry: Entry): void {
    if (entry.gone) return;
    entry.gone = true;
    if (this.byKid.get(entry.kid) === entry) this.byKid.delete(entry.kid);
    if (this.byHost.get(entry.hostId) === entry) this.byHost.delete(entry.hostId);
    for (const idle of entry.idle.splice(0)) {
      idle.unwatch();
      idle.stream.destroy();
    }
    for (const w of entry.waiters.splice(0)) w(undefined);
  }

  /** `answer`: the agent sent a preamble and waits for the answer line (then the end; cut after DATA_REFUSE_FLUSH_MS). */
  private refuse(stream: Duplex, info: ConnInfo, reason: DataRefusal, why: string, answer: boolean): void {
    recordDataRefused(reason);
    if (answer && !stream.destroyed) {
      const cut = setTimeout(() => stream.destroy(), DATA_REFUSE_FLUSH_MS);
      cut.unref();
      stream.once('close', () => clearTimeout(cut));
      stream.end(dataAnswer({ ok: false, reason }));
      stream.resume(); // whatever else it sends is discarded until the end
    } else stream.destroy();
    const now = Date.now();
    if ((this.lastLogged.get(reason) ?? -Infinity) > now - DATA_LOG_GAP_MS) return;
    this.lastLogged.set(reason, now);
    this.log.warn({ code: 'GW_ERR_E2E_DATA', reason, client: clientOf(info), why }, 'data connection refused (logged once per 10 s per reason)');
  }

  close(): void {
    this.unwatch();
    for (const entry of [...this.byKid.values()]) this.detach(entry);
  }
}

function handOut(idle: Idle): { n: number; stream: Duplex } {
  idle.unwatch();
  return { n: idle.n, stream: idle.stream };
}
