/**
 * TLS as the client on a stream we already hold (a socket from the Dialer, direct or through a CONNECT proxy):
 * the one place that wraps it and waits for the handshake, for every client that dials then speaks TLS (the
 * agent's tunnel, gwsh's resource routes, the Kubernetes API dial, HTTPS through the Dialer).
 *
 * SNI: `servername` when given, else the host unless the host is an IP address (SNI carries names only).
 * Resolves on 'secureConnect'; rejects with the socket's first error as it came, for the caller to classify
 * (src/dial/tlsverify.ts) and name. The error listener stays on after the handshake, as it always has.
 */
import net from 'node:net';
import type { Duplex } from 'node:stream';
import tls from 'node:tls';

export function connectTls(stream: Duplex, options: Omit<tls.ConnectionOptions, 'socket'> & { host: string }): Promise<tls.TLSSocket> {
  const servername = options.servername ?? (net.isIP(options.host) ? undefined : options.host);
  const { servername: _given, ...rest } = options;
  const socket = tls.connect({ ...rest, socket: stream, ...(servername ? { servername } : {}) });
  return new Promise<tls.TLSSocket>((resolve, reject) => {
    socket.once('secureConnect', () => resolve(socket));
    socket.once('error', reject);
  });
}
