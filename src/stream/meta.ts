/**
 * Per-stream metadata, all of it here: what the gateway learns about a stream (the client's real address from
 * a PROXY header, who a tunnelled SSH connection is for, what an SSH endpoint was handed with a stream) is kept
 * in WeakMaps keyed by the stream. Never as properties stuck on the stream object: those need casts, can clash
 * with a library's own fields, and a WeakMap entry goes when the stream does.
 *
 * A TLS socket we terminate runs on a routed stream; src/net/tls.ts records the pair (wrapStream), and a
 * lookup on the TLS socket that finds nothing of its own falls back to the stream it wraps (one level).
 */
import type { Duplex } from 'node:stream';

const wrapped = new WeakMap<object, object>();

/** Records that outer (a TLS socket) runs on inner, so that outer sees inner's metadata. */
export function wrapStream(outer: object, inner: object): void {
  wrapped.set(outer, inner);
}

/** One kind of metadata, by stream. */
export class StreamMeta<T> {
  private readonly values = new WeakMap<object, T>();

  set(stream: object, value: T): void {
    this.values.set(stream, value);
  }

  /** The value recorded for stream, else for the stream it wraps. */
  get(stream: object): T | undefined {
    const own = this.values.get(stream);
    if (own !== undefined) return own;
    const inner = wrapped.get(stream);
    return inner ? this.values.get(inner) : undefined;
  }
}

/**
 * The real client address of a routed stream (from a PROXY header when one was accepted), so that logs, rate
 * limits and authorization see the client rather than the load balancer.
 */
const addresses = new StreamMeta<{ address: string; port: number }>();

export function setClientAddress(stream: Duplex, address: string, port: number): void {
  addresses.set(stream, { address, port });
}

/** The client address for a socket or a TLS socket wrapped around a routed stream; falls back to the peer. */
export function clientAddress(socket: { remoteAddress?: string | undefined; remotePort?: number | undefined }): { address: string; port: number } {
  return addresses.get(socket) ?? { address: socket.remoteAddress ?? 'unknown', port: socket.remotePort ?? 0 };
}

/**
 * Streams that arrived inside a connection upgrade (src/proxy/frontdoor.ts): a web request on such a stream may not
 * be upgraded again (an upgrade inside an upgrade is a loop, never a client's need).
 */
const upgraded = new StreamMeta<true>();

export function markUpgraded(stream: Duplex): void {
  upgraded.set(stream, true);
}

/** Whether socket (or the stream a TLS socket wraps) came through a connection upgrade. */
export function cameThroughUpgrade(socket: object): boolean {
  return upgraded.get(socket) === true;
}
