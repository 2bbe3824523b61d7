/**
 * An end that can be trusted, on a TLS connection between two of the gateway's own processes (gwsh and the Proxy
 * on the resource routes, docs/proxy.md; two Proxies on gateway-peer-tls, docs/high-availability.md).
 *
 * Neither end of such a connection can tell a clean end from a cut by itself: a process killed with SIGKILL has
 * its kernel close its sockets with a FIN, and Node's TLS reports a FIN without close_notify as an ordinary 'end';
 * and an RST that arrives right behind data is reported by libuv as an end too (a read that returned less than it
 * asked for, then the hang-up: no read is tried that would have seen ECONNRESET). So the end is said in the
 * stream itself, once both ends have agreed to it (the route header's `framed`, the answer's `framed`):
 *
 *   frame   a 4-byte big-endian length L, then L bytes of data (1 <= L <= FRAME_MAX_BYTES)
 *   end     a frame of length 0: this direction ended cleanly (what a FIN meant before)
 *
 * The connection itself is ended (close_notify, FIN) only once both directions have ended this way. Anything
 * else the reading end sees is a break, and the stream is destroyed without ending (its relay resets the other
 * side, src/stream/splice.ts): the connection's end, error or reset without the end frame before it, a frame over
 * the bound, bytes after the end frame. Resetting a FramedStream resets the connection under it.
 *
 * FrameReader is the parser: pure, bounded (4 bytes of header state; data is handed on as views, never copied
 * or held) and incremental.
 */
import { Duplex } from 'node:stream';
import { GatewayError } from '../errors.js';
import { RESET_STREAM, resetStream } from './reset.js';

/** The largest frame either end sends or takes. */
export const FRAME_MAX_BYTES = 1024 * 1024;
const END_FRAME = Buffer.alloc(4);

/** The incremental parser of one direction. */
export class FrameReader {
  private readonly header = Buffer.alloc(4);
  private headerHave = 0;
  /** Data bytes of the current frame still to come. */
  private left = 0;
  /** The end frame arrived. */
  ended = false;

  /** Hands each piece of data to onData; throws GW_ERR_TUNNEL_PROTOCOL for a bad frame or bytes after the end. */
  feed(chunk: Buffer, onData: (data: Buffer) => void): void {
    let at = 0;
    while (at < chunk.length) {
      if (this.ended) throw new GatewayError('GW_ERR_TUNNEL_PROTOCOL', 'framed stream: bytes after its end frame');
      if (this.left > 0) {
        const n = Math.min(this.left, chunk.length - at);
        onData(n === chunk.length ? chunk : chunk.subarray(at, at + n));
        this.left -= n;
        at += n;
        continue;
      }
      const n = Math.min(4 - this.headerHave, chunk.length - at);
      chunk.copy(this.header, this.headerHave, at, at + n);
      this.headerHave += n;
      at += n;
      if (this.headerHave < 4) return;
      this.headerHave = 0;
      const length = this.header.readUInt32BE(0);
      if (length > FRAME_MAX_BYTES) throw new GatewayError('GW_ERR_TUNNEL_PROTOCOL', `framed stream: a frame of ${length} bytes (at most ${FRAME_MAX_BYTES})`);
      if (length === 0) this.ended = true;
      this.left = length;
    }
  }
}

function header(length: number): Buffer {
  const h = Buffer.allocUnsafe(4);
  h.writeUInt32BE(length, 0);
  return h;
}

/** A Duplex over `inner` (the TLS socket) that speaks the frames above; only the end frame ends it. */
export class FramedStream extends Duplex {
  private readonly reader = new FrameReader();
  private drainWaiter: (() => void) | undefined;

  constructor(readonly inner: Duplex) {
    super({ allowHalfOpen: true });
    inner.on('data', this.onData);
    inner.on('drain', this.onDrain);
    inner.once('end', this.onBreak);
    inner.once('close', this.onBreak);
    inner.on('error', this.onBreak);
  }

  private readonly onData = (chunk: Buffer): void => {
    try {
      this.reader.feed(chunk, (data) => {
        if (!this.push(data)) this.inner.pause();
      });
    } catch {
      return this.onBreak();
    }
    if (this.reader.ended) {
      this.inner.off('data', this.onData);
      this.push(null);
    }
  };

  /** The connection went (or broke the framing) before this direction's end frame: a break, not an end. */
  private readonly onBreak = (): void => {
    if (this.reader.ended && !this.inner.destroyed) return; // the peer's end came; its closing is ours to wait for
    if (!this.destroyed) this.destroy();
  };

  private readonly onDrain = (): void => {
    const waiter = this.drainWaiter;
    this.drainWaiter = undefined;
    waiter?.();
  };

  override _read(): void {
    this.inner.resume();
  }

  override _write(chunk: Buffer, _encoding: BufferEncoding, cb: (err?: Error | null) => void): void {
    let ok = true;
    this.inner.cork();
    for (let at = 0; at < chunk.length; at += FRAME_MAX_BYTES) {
      const piece = chunk.length <= FRAME_MAX_BYTES ? chunk : chunk.subarray(at, at + FRAME_MAX_BYTES);
      this.inner.write(header(piece.length));
      ok = this.inner.write(piece);
    }
    this.inner.uncork();
    if (ok) cb();
    else this.drainWaiter = () => cb();
  }

  override _final(cb: (err?: Error | null) => void): void {
    this.inner.write(END_FRAME);
    cb();
  }

  override _destroy(err: Error | null, cb: (err?: Error | null) => void): void {
    this.drainWaiter = undefined;
    this.inner.off('data', this.onData);
    // Both directions ended with their end frames: the connection closes cleanly; any other way it is reset.
    if (this.reader.ended && this.writableFinished) this.inner.end();
    else resetStream(this.inner);
    cb(err);
  }

  [RESET_STREAM](): void {
    resetStream(this.inner);
    this.destroy();
  }
}
