/**
 * Tunnel protocol v2: streams multiplexed over one mutual-TLS connection (frames: src/tunnel/frames.ts).
 *
 *   TunnelSession   one per tunnel, at either end. The Proxy opens streams (openStream()); the agent gets them
 *                   (onStream). Stream 0, `control`, exists from the start at both ends (JSON lines).
 *   TunnelStream    a node:stream Duplex per stream, so pipe()/splice() and the line helpers work unchanged.
 *
 * Flow control: every stream (control included) starts with INITIAL_WINDOW bytes of credit in each direction, a
 * constant of the protocol. Each receiver chooses its own window (`window`, 2 MiB by default) and grants the
 * difference in a WINDOW frame as the stream opens, so the two ends need not agree on it. Then it gives credit
 * back only for bytes its consumer has taken out of the stream's buffer, once a quarter of the window has been
 * taken: a consumer that stops reading stops the sender after `window` bytes, whatever the sender does (more is
 * a protocol error that closes the tunnel). The sender sends at most its credit and holds the rest, and the
 * write callback of the chunk waits for it.
 *
 * The connection: frames of every stream are written to the socket as they come, corked for the rest of the tick
 * (one TLS write for many frames); a payload is written as is after its 9-byte header, never copied. Once the
 * socket holds SOCKET_BUFFER_BYTES, every write callback waits for its 'drain'.
 *
 * Closing: FIN ends the peer's readable side (half-close); a stream whose both halves ended is forgotten. A
 * stream destroyed before that sends RST, and an RST received destroys the stream (without an error: the other
 * side of a splice goes down with it, as with an SSH channel). Frames for a stream that is gone (in flight when it
 * ended) are ignored; frames for a stream that never existed, a stream ID opened twice, an OPEN sent by the agent,
 * DATA after FIN, or a window overflow are protocol errors: the tunnel closes and onClose hears why. OPENs beyond
 * maxStreams open streams are refused with RST, and the tunnel stays.
 *
 * Idle cost: a session holds no timer, no buffer beyond the decoder's 9 bytes, and the control stream.
 */
import { Duplex } from 'node:stream';
import { GatewayError } from '../errors.js';
import { CONTROL_STREAM, FrameDecoder, frameHeader, FrameType, MAX_FRAME_PAYLOAD, MAX_STREAM_ID, rstFrame, windowFrame, type FrameSink } from './frames.js';

/** The credit every stream starts with, each way: part of the protocol, never changed (docs/tunnels.md). */
export const INITIAL_WINDOW = 256 * 1024;
export const DEFAULT_STREAM_WINDOW = 2 * 1024 * 1024;
export const DEFAULT_MAX_STREAMS = 1024;
/**
 * How much the TLS socket may hold before streams' write callbacks wait for its 'drain'. Its own mark (16 KiB)
 * would make every frame or two wait; 256 KiB lets a tick's frames go out as one large TLS write, and measured
 * about a tenth less CPU per byte in the Proxy and in squid (docs/tunnels.md).
 */
export const SOCKET_BUFFER_BYTES = 256 * 1024;
/** The most credit a sender may hold (a WINDOW past it is a protocol error). */
const MAX_CREDIT = 0xffff_ffff;

export interface TunnelSessionOptions {
  /** proxy: opens streams; agent: accepts the Proxy's OPENs. */
  role: 'proxy' | 'agent';
  /** The most this end buffers per stream (its receive window), at least INITIAL_WINDOW. */
  window?: number;
  /** Open streams (control excluded) beyond which an OPEN is refused with RST. */
  maxStreams?: number;
  /** The agent's end: a stream the Proxy opened. */
  onStream?: (stream: TunnelStream) => void;
  /** The session is over: the socket closed, or err says which protocol error closed it. */
  onClose?: (err?: GatewayError) => void;
}

type WriteCallback = (err?: Error | null) => void;

const protocolError = (message: string) => new GatewayError('GW_ERR_TUNNEL_PROTOCOL', `tunnel v2: ${message}`);

export class TunnelStream extends Duplex {
  /** Credit this end may still send. */
  sendCredit: number;
  /** Bytes pushed to the readable side, and credit given back for them. */
  received = 0;
  credited = 0;
  finSent = false;
  finReceived = false;
  resetByPeer = false;
  /** Why the peer reset it (its RST reason). */
  resetReason: string | undefined;
  private pendingChunk: Buffer | undefined;
  private pendingCb: WriteCallback | undefined;
  private creditCheckQueued = false;

  constructor(
    readonly id: number,
    private readonly session: TunnelSession,
  ) {
    super({ allowHalfOpen: true });
    this.sendCredit = INITIAL_WINDOW;
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, cb: WriteCallback): void {
    this.pendingChunk = chunk;
    this.pendingCb = cb;
    this.flush();
  }

  /** Sends what the credit allows of the pending chunk; its callback once all of it went out. */
  flush(): void {
    let chunk = this.pendingChunk;
    if (!chunk) return;
    while (chunk.length > 0 && this.sendCredit > 0) {
      const n = Math.min(chunk.length, this.sendCredit, MAX_FRAME_PAYLOAD);
      this.session.sendData(this.id, n === chunk.length ? chunk : chunk.subarray(0, n));
      this.sendCredit -= n;
      chunk = n === chunk.length ? EMPTY : chunk.subarray(n);
    }
    if (chunk.length > 0) {
      this.pendingChunk = chunk;
      return;
    }
    const cb = this.pendingCb!;
    this.pendingChunk = undefined;
    this.pendingCb = undefined;
    this.session.afterWrite(cb);
  }

  override _final(cb: WriteCallback): void {
    this.finSent = true;
    this.session.sendFin(this.id);
    cb();
  }

  override _read(): void {
    // read() calls _read before it takes the bytes out of the buffer: count them once it has.
    if (this.creditCheckQueued) return;
    this.creditCheckQueued = true;
    process.nextTick(checkCredit, this);
  }

  /** Bytes of the peer's arrived (called by the session). */
  deliver(payload: Buffer): void {
    this.received += payload.length;
    this.push(payload);
    this.giveCredit();
  }

  /** Credit back for what the consumer took, once it is worth a frame. */
  giveCredit(): void {
    this.creditCheckQueued = false;
    if (this.destroyed || this.finReceived) return;
    const taken = this.received - this.readableLength - this.credited;
    if (taken >= this.session.creditThreshold) {
      this.credited += taken;
      this.session.sendWindow(this.id, taken);
    }
  }

  override _destroy(err: Error | null, cb: (err?: Error | null) => void): void {
    this.pendingChunk = undefined;
    this.pendingCb = undefined;
    this.session.forget(this);
    cb(err);
  }
}

const EMPTY = Buffer.alloc(0);

function checkCredit(stream: TunnelStream): void {
  stream.giveCredit();
}

function uncork(session: TunnelSession): void {
  session.uncork();
}

export class TunnelSession implements FrameSink {
  readonly control: TunnelStream;
  readonly streamWindow: number;
  readonly creditThreshold: number;
  private readonly maxStreams: number;
  private readonly streams = new Map<number, TunnelStream>();
  private readonly decoder = new FrameDecoder();
  /** Proxy: the next ID to open; agent: the highest ID opened so far (IDs only grow). */
  private lastId = 0;
  private corked = false;
  private drainWaiters: WriteCallback[] | undefined;
  /** The stream whose DATA payload is arriving (undefined: a stream that is gone: the payload is dropped). */
  private rx: TunnelStream | undefined;
  private closed = false;

  constructor(
    readonly socket: Duplex,
    private readonly options: TunnelSessionOptions,
  ) {
    this.streamWindow = Math.max(INITIAL_WINDOW, Math.min(MAX_CREDIT, options.window ?? DEFAULT_STREAM_WINDOW));
    this.creditThreshold = Math.max(1, Math.floor(this.streamWindow / 4));
    this.maxStreams = options.maxStreams ?? DEFAULT_MAX_STREAMS;
    this.control = new TunnelStream(CONTROL_STREAM, this);
    this.streams.set(CONTROL_STREAM, this.control);
    this.grantWindow(CONTROL_STREAM);
    socket.on('data', this.onData);
    socket.on('drain', this.onDrain);
    socket.once('end', this.onEnd);
    socket.once('close', this.onSocketClose);
    socket.on('error', this.onSocketError);
  }

  /** Open streams, control excluded. */
  get size(): number {
    return this.streams.size - (this.streams.has(CONTROL_STREAM) ? 1 : 0);
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /** The Proxy's end: a new stream (its OPEN is written in this tick, with whatever is written to it next). */
  openStream(): TunnelStream {
    if (this.options.role !== 'proxy') throw new GatewayError('GW_ERR_INTERNAL', 'only the Proxy opens tunnel streams');
    if (this.closed) throw new GatewayError('GW_ERR_TUNNEL_DOWN', 'the tunnel is closed');
    if (this.lastId >= MAX_STREAM_ID) throw new GatewayError('GW_ERR_TUNNEL_DOWN', 'the tunnel has used every stream ID; it must reconnect');
    const id = ++this.lastId;
    const stream = new TunnelStream(id, this);
    this.streams.set(id, stream);
    this.write(frameHeader(FrameType.OPEN, id, 0));
    this.grantWindow(id);
    return stream;
  }

  /** Ends the connection after what is queued (the peer sees the socket end). */
  end(): void {
    if (this.closed) return;
    this.socket.end();
  }

  /** Drops the connection now; err (a protocol error) goes to onClose. */
  destroy(err?: GatewayError): void {
    this.shutdown(err);
    this.socket.destroy();
  }

  // --- writing -------------------------------------------------------------------------------------------------

  sendData(id: number, payload: Buffer): void {
    this.write(frameHeader(FrameType.DATA, id, payload.length));
    this.write(payload);
  }

  /** A new stream: the credit of this end's window beyond the protocol's initial one. */
  private grantWindow(id: number): void {
    if (this.streamWindow > INITIAL_WINDOW) this.sendWindow(id, this.streamWindow - INITIAL_WINDOW);
  }

  sendWindow(id: number, credit: number): void {
    this.write(windowFrame(id, credit));
  }

  sendFin(id: number): void {
    if (id === CONTROL_STREAM) return this.end(); // the control stream ends with the tunnel
    this.write(frameHeader(FrameType.FIN, id, 0));
  }

  /** A write callback: now, or once the socket drained. */
  afterWrite(cb: WriteCallback): void {
    if (this.drainWaiters) this.drainWaiters.push(cb);
    else cb();
  }

  /** A stream is gone: forgotten, and reset unless both halves ended (or the peer reset it). */
  forget(stream: TunnelStream): void {
    if (this.streams.get(stream.id) !== stream) return;
    this.streams.delete(stream.id);
    if (this.rx === stream) this.rx = undefined;
    if (this.closed || stream.resetByPeer || (stream.finSent && stream.finReceived)) return;
    if (stream.id === CONTROL_STREAM) return this.end();
    this.write(rstFrame(stream.id, 'closed'));
  }

  uncork(): void {
    this.corked = false;
    this.socket.uncork();
  }

  private write(buf: Buffer): void {
    if (this.closed) return;
    if (!this.corked) {
      this.corked = true;
      this.socket.cork();
      process.nextTick(uncork, this);
    }
    if (!this.socket.write(buf) && !this.drainWaiters && this.socket.writableLength >= SOCKET_BUFFER_BYTES) this.drainWaiters = [];
  }

  private readonly onDrain = (): void => {
    const waiters = this.drainWaiters;
    this.drainWaiters = undefined;
    if (waiters) for (const cb of waiters) cb();
  };

  // --- reading (FrameSink) -------------------------------------------------------------------------------------

  private readonly onData = (chunk: Buffer): void => {
    try {
      this.decoder.push(chunk, this);
    } catch (err) {
      this.destroy(err instanceof GatewayError ? err : protocolError((err as Error).message));
    }
  };

  /** The stream a frame names: undefined for one that is gone; a protocol error for one that never was. */
  private target(id: number, what: string): TunnelStream | undefined {
    const stream = this.streams.get(id);
    if (stream) return stream;
    if (id > this.lastId) throw protocolError(`${what} for stream ${id}, which was never opened`);
    return undefined;
  }

  dataHeader(id: number, length: number): void {
    const stream = this.target(id, 'DATA');
    this.rx = stream;
    if (!stream) return;
    if (stream.finReceived) throw protocolError(`DATA on stream ${id} after its FIN`);
    if (stream.received - stream.credited + length > this.streamWindow) throw protocolError(`DATA beyond the window on stream ${id}`);
  }

  data(_id: number, payload: Buffer): void {
    const stream = this.rx;
    if (stream && !stream.destroyed) stream.deliver(payload);
  }

  open(id: number): void {
    if (this.options.role !== 'agent') throw protocolError('an OPEN from the agent');
    if (id <= this.lastId) throw protocolError(`stream ${id} opened again`);
    this.lastId = id;
    if (this.size >= this.maxStreams) {
      this.write(rstFrame(id, `too many streams (at most ${this.maxStreams})`));
      return;
    }
    const stream = new TunnelStream(id, this);
    this.streams.set(id, stream);
    this.grantWindow(id);
    this.options.onStream?.(stream);
  }

  window(id: number, credit: number): void {
    const stream = this.target(id, 'WINDOW');
    if (!stream) return;
    if (stream.sendCredit + credit > MAX_CREDIT) throw protocolError(`window overflow on stream ${id}`);
    stream.sendCredit += credit;
    stream.flush();
  }

  fin(id: number): void {
    const stream = this.target(id, 'FIN');
    if (!stream) return;
    if (stream.finReceived) throw protocolError(`a second FIN on stream ${id}`);
    stream.finReceived = true;
    stream.push(null);
  }

  rst(id: number, reason: string): void {
    const stream = this.target(id, 'RST');
    if (!stream) return;
    stream.resetByPeer = true;
    stream.resetReason = reason;
    stream.destroy();
  }

  // --- the end -------------------------------------------------------------------------------------------------

  private readonly onEnd = (): void => {
    // No half-close of the whole tunnel: the peer ending its side ends the session.
    if (!this.socket.writableEnded) this.socket.end();
    this.shutdown();
  };

  private readonly onSocketClose = (): void => this.shutdown();

  private readonly onSocketError = (): void => {
    this.socket.destroy();
  };

  private shutdown(err?: GatewayError): void {
    if (this.closed) return;
    this.closed = true;
    this.socket.off('data', this.onData);
    this.onDrain();
    for (const stream of [...this.streams.values()]) stream.destroy();
    this.streams.clear();
    this.options.onClose?.(err);
  }
}
