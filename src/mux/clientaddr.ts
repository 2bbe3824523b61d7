/**
 * The real client address of a routed stream (from a PROXY header when one was accepted), so that logs, rate
 * limits and authorization see the client rather than the load balancer.
 */
import type { Duplex } from 'node:stream';

const addresses = new WeakMap<object, { address: string; port: number }>();

export function setClientAddress(stream: Duplex, address: string, port: number): void {
  addresses.set(stream, { address, port });
}

/** The client address for a socket or a TLS socket wrapped around a routed stream; falls back to the peer. */
export function clientAddress(socket: { remoteAddress?: string | undefined; remotePort?: number | undefined }): { address: string; port: number } {
  const direct = addresses.get(socket);
  if (direct) return direct;
  const parent = (socket as { _parent?: object })._parent;
  const inherited = parent ? addresses.get(parent) : undefined;
  return inherited ?? { address: socket.remoteAddress ?? 'unknown', port: socket.remotePort ?? 0 };
}
