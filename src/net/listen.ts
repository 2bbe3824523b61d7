/**
 * Listeners: every TCP port the gateway opens is a guarded net.Server (its connections admitted against the
 * caps of src/net/deadlines.ts before anything reads from them), bound with errors that name the address and
 * the configuration key.
 */
import net from 'node:net';
import type http from 'node:http';
import { formatHostPort, type HostPort } from '../addr.js';
import { GatewayError } from '../errors.js';
import type { Connection, ListenerGuard } from './deadlines.js';

/** TCP keep-alive probes start after this long without traffic: the kernel finds peers that vanished. */
const KEEPALIVE_IDLE_MS = 60_000;

/** The open connections of each guarded server, for closeServer(). */
const openSockets = new WeakMap<net.Server, Set<net.Socket>>();

/**
 * A TCP server whose connections pass guard.admit() first (over a cap: closed at once, counted and logged).
 * Half-open connections are allowed so that spliced streams can pass a half-close through; the Connection
 * bounds how long a half-closed one may linger.
 */
export function guardedServer(guard: ListenerGuard, onSocket: (socket: net.Socket, conn: Connection) => void): net.Server {
  const server = net.createServer({ noDelay: true, allowHalfOpen: true, keepAlive: true, keepAliveInitialDelay: KEEPALIVE_IDLE_MS });
  const open = new Set<net.Socket>();
  openSockets.set(server, open);
  server.on('connection', (socket: net.Socket) => {
    // A reset that arrives before a protocol handler listens must not take the process down.
    socket.on('error', () => undefined);
    const conn = guard.admit(socket);
    if (!conn) return;
    open.add(socket);
    socket.once('close', () => open.delete(socket));
    onSocket(socket, conn);
  });
  return server;
}

export function listenOn(server: net.Server, addr: HostPort, what: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const onError = (err: NodeJS.ErrnoException) => {
      const where = formatHostPort(addr.host, addr.port);
      const hint =
        err.code === 'EADDRINUSE'
          ? `Another process listens on ${where}: stop it or change ${what} in the configuration.`
          : err.code === 'EACCES'
            ? `Ports below 1024 need root or CAP_NET_BIND_SERVICE; run as root or choose a port of 1024 or more for ${what}.`
            : err.code === 'EADDRNOTAVAIL'
              ? `No interface of this machine has the address ${addr.host}; change ${what}.`
              : `Check ${what} in the configuration.`;
      reject(new GatewayError('GW_ERR_LISTEN', `cannot listen on ${where} (${what}): ${err.code ?? err.message}`, { hint, cause: err }));
    };
    server.once('error', onError);
    server.listen({ port: addr.port, host: addr.host, backlog: 4096 }, () => {
      server.off('error', onError);
      const a = server.address() as net.AddressInfo;
      resolve(formatHostPort(a.address, a.port));
    });
  });
}

/** Stops listening and closes its open connections (HTTP or guarded); resolves once the server has closed. */
export function closeServer(server: net.Server): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    if ('closeAllConnections' in server) (server as http.Server).closeAllConnections();
    for (const socket of openSockets.get(server) ?? []) socket.destroy();
  });
}
