/**
 * The Proxy's SSH servers (reverse tunnels, the SSH jump host) run ssh2's Server on streams we hand it
 * (injectSocket). This wrapper adds what ssh2 does not do, through the connection's phases
 * (src/net/deadlines.ts):
 *
 *   ssh-handshake  from the hand-off to authentication ('ready'): version exchange, key exchange and
 *                  authentication within ssh_handshake_timeout (ssh2 has no such deadline);
 *   ssh-idle       an authenticated connection with no open channel is closed after idle_timeout (channels
 *                  are counted with channelOpened); a peer that stops answering is dropped by ssh2's own
 *                  keepalives (every 15 s, 3 missed);
 *   end            SSH has no half-close: when the client ends its side we end ours. ssh2 never does, and on
 *                  listeners that allow half-open connections every client that sent its version and closed
 *                  left a socket in CLOSE-WAIT for good.
 *
 * ssh2 gives a Connection no public way back to the stream it runs on (its 'connection' event comes after the
 * client's version line, with an ip and port that are not the client's when a PROXY header or TLS came first).
 * streamOf finds the stream, its deadlines and what the caller attached to it, through the private field that
 * src/internals.ts reads (with why and the fallback: a connection whose stream cannot be found is ended at once);
 * the agent's SSH Service, which runs its own ssh2 Server, asks streamOf too. Client side, nothing needs it: a
 * Client runs on the stream its caller handed to connect().
 */
import type { EventEmitter } from 'node:events';
import type { Duplex } from 'node:stream';
import ssh2 from 'ssh2';
import type { Connection as SshConnection } from 'ssh2';
import { sshConnectionStream } from '../internals.js';
import { StreamMeta } from '../stream/meta.js';
import { connectionOf, type LimitSettings } from './deadlines.js';

export type SshDeadlines = Pick<LimitSettings, 'sshHandshakeMs' | 'idleMs'>;

export interface SshEndpointOptions<M> {
  hostKeys: string[];
  ident: string;
  deadlines: SshDeadlines;
  /** A client connection, once its version line arrived; meta is what inject() was given with its stream. */
  onConnection(conn: SshConnection, meta: M): void;
}

export class SshEndpoint<M> {
  private readonly server: ssh2.Server;
  private readonly meta = new StreamMeta<M>();
  private readonly openChannels = new WeakMap<SshConnection, number>();

  constructor(private readonly options: SshEndpointOptions<M>) {
    this.server = new ssh2.Server({ hostKeys: options.hostKeys, ident: options.ident }, (conn) => this.onConnection(conn));
  }

  /** Hands the endpoint a stream that carries (or will carry) an SSH client connection. */
  inject(stream: Duplex, meta: M): void {
    this.meta.set(stream, meta);
    connectionOf(stream).enter('ssh-handshake', this.options.deadlines.sshHandshakeMs);
    this.server.injectSocket(stream as never);
    stream.once('end', () => {
      if (!stream.writableEnded && !stream.destroyed) stream.end();
    });
  }

  /** Counts channel as open until it closes: an authenticated connection with none open is idle. */
  channelOpened(conn: SshConnection, channel: EventEmitter): void {
    const stream = streamOf(conn);
    if (!stream) return;
    this.openChannels.set(conn, (this.openChannels.get(conn) ?? 0) + 1);
    connectionOf(stream).leave('ssh-idle');
    channel.once('close', () => {
      const left = (this.openChannels.get(conn) ?? 1) - 1;
      this.openChannels.set(conn, left);
      if (left === 0) connectionOf(stream).enter('ssh-idle', this.options.deadlines.idleMs);
    });
  }

  /** Drops the connection's transport now (a peer that stopped answering sends no FIN). */
  destroy(conn: SshConnection): void {
    const stream = streamOf(conn);
    if (stream) connectionOf(stream).destroy();
  }

  private onConnection(conn: SshConnection): void {
    const stream = streamOf(conn);
    conn.on('error', () => undefined); // the services log what matters; an unhandled 'error' would end the process
    // Not found (ssh2 changed, src/internals.ts): its handshake deadline could not be lifted nor its origin told.
    if (!stream) return void conn.end();
    conn.once('ready', () => {
      if ((this.openChannels.get(conn) ?? 0) === 0) connectionOf(stream).enter('ssh-idle', this.options.deadlines.idleMs);
      else connectionOf(stream).leave('ssh-handshake');
    });
    this.options.onConnection(conn, this.meta.get(stream) as M);
  }
}

/** The stream an ssh2 server Connection runs on, or undefined (see the module comment). */
export function streamOf(conn: SshConnection): Duplex | undefined {
  return sshConnectionStream(conn);
}
