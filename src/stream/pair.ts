/**
 * Two connected in-memory Duplex streams: what one side writes, the other reads, with backpressure (a write's
 * callback waits until the reader drains) and half-close (end() on one side ends the other's readable side).
 * Destroying either side destroys both, as a reset would. Node 20 has no stream.duplexPair (added in 22.6);
 * this is its few lines.
 */
import { Duplex } from 'node:stream';

class Side extends Duplex {
  peer!: Side;
  /** The callback of this side's write that the peer has not yet read past. */
  pending: ((err?: Error | null) => void) | undefined;
  constructor() {
    super({ allowHalfOpen: true });
  }
  override _read(): void {
    const cb = this.peer.pending;
    this.peer.pending = undefined;
    cb?.();
  }
  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (err?: Error | null) => void): void {
    if (this.peer.destroyed) return cb(new Error('the other side of the stream pair is closed'));
    if (this.peer.push(chunk)) cb();
    else this.pending = cb;
  }
  override _final(cb: (err?: Error | null) => void): void {
    if (!this.peer.destroyed) this.peer.push(null);
    cb();
  }
  override _destroy(err: Error | null, cb: (err: Error | null) => void): void {
    const pending = this.pending;
    this.pending = undefined;
    pending?.(err ?? new Error('the stream pair was closed'));
    if (!this.peer.destroyed) this.peer.destroy();
    cb(err);
  }
}

export function duplexPair(): [Duplex, Duplex] {
  const a = new Side();
  const b = new Side();
  a.peer = b;
  b.peer = a;
  return [a, b];
}
