/**
 * The Proxy's end of reverse tunnels (the protocol: src/tunnel/): an SSH server (ssh2) fed with streams from the front door (TLS with ALPN
 * gateway-reversetunnel on 443, or raw SSH on 3024), a registry of connected agents and what they serve, and
 * dialing through an agent's tunnel.
 *
 * Authentication: the SSH user name is the agent's host ID and its key must be the one its host certificate
 * certifies (recorded at join). When the stream came over TLS with a client certificate, that certificate must
 * name the same host of this cluster. The agent must still be a member and not locked (AuthService.revocationOf);
 * its tunnel is tracked in auth.sessions, so a lock on it drops the tunnel, and reconnects are refused while the
 * lock lasts. An agent keeps one tunnel per Proxy: a new one replaces the one it had here, unless its hello says
 * it still holds that one (holds: an agent pool behind a load balancer that landed here again), then the new
 * one is answered `duplicate` and closed. Liveness: the agent sends a heartbeat every interval; after countMax
 * intervals without one the proxy marks it offline and drops the connection. The control channel is read
 * through src/tunnel/control.ts: a line over the cap closes the connection, unknown messages are ignored.
 */
import { randomUUID } from 'node:crypto';
import { EventEmitter } from 'node:events';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import ssh2 from 'ssh2';
import type { Connection, ServerChannel } from 'ssh2';
import { identityFromCert, type Identity } from '../auth/pki.js';
import type { ProxyAuth } from '../auth/proxyauth.js';
import { GatewayError } from '../errors.js';
import { logger } from '../log.js';
import type { ConnInfo } from '../mux/multiplexer.js';
import { SshEndpoint, type SshDeadlines } from '../net/ssh.js';
import type { ClusterView } from './cluster.js';
import { readLine, writeJsonLine } from '../stream/lines.js';
import { Heartbeat, parseControlMessage, readControl } from '../tunnel/control.js';
import {
  CONTROL_SUBSYSTEM,
  PROTOCOL_VERSION,
  TUNNEL_BIND,
  type AgentResources,
  type ControlMessage,
  type DialAnswer,
  type DialRequest,
  type HelloMessage,
  type ServiceKind,
} from '../tunnel/protocol.js';

export interface ConnectedAgent {
  hostId: string;
  nodename: string;
  services: ServiceKind[];
  resources: AgentResources;
  connectedAt: Date;
  lastHeartbeat: Date;
  remote: string;
  conn: Connection;
  control: ServerChannel;
}

export interface TunnelServerOptions {
  auth: ProxyAuth;
  /** SSH host key (SEC1 or OpenSSH PEM) of this proxy's tunnel server. */
  hostKey: string;
  heartbeatIntervalMs: number;
  heartbeatCountMax: number;
  proxyId?: string;
  /** Address agents are told about in discovery. */
  publicAddr: string;
  helloTimeoutMs?: number;
  dialTimeoutMs?: number;
  /** SSH handshake and idle deadlines (gateway.limits); ssh2 has none of its own. */
  deadlines?: SshDeadlines;
  /** The cluster's Proxies and tunnel strategy: what discovery tells agents (else this Proxy alone, agent_mesh). */
  cluster?: Pick<ClusterView, 'proxies' | 'strategy' | 'on'>;
}

/** What the front door knows about a tunnel stream: where it came from and the TLS client certificate, if any. */
interface TunnelMeta {
  info: ConnInfo;
  tlsIdentity?: { name: string; cluster: string } | Error;
}

const DEFAULT_DEADLINES: SshDeadlines = { sshHandshakeMs: 30_000, idleMs: 300_000 };

export class TunnelServer extends EventEmitter {
  readonly proxyId: string;
  private readonly agents = new Map<string, ConnectedAgent>();
  private readonly endpoint: SshEndpoint<TunnelMeta | undefined>;
  private readonly log = logger('tunnel');
  private closing = false;

  constructor(private readonly options: TunnelServerOptions) {
    super();
    this.proxyId = options.proxyId ?? randomUUID();
    this.endpoint = new SshEndpoint({
      hostKeys: [options.hostKey],
      ident: 'gateway-tunnel',
      deadlines: options.deadlines ?? DEFAULT_DEADLINES,
      onConnection: (conn, meta) => this.onConnection(conn, meta),
    });
    this.unwatch = options.auth.watchMaintenance(() => {
      for (const agent of this.agents.values()) writeJsonLine(agent.control, { type: 'maintenance-changed' } satisfies ControlMessage);
    });
    // A Proxy joined or left, or the strategy changed: every agent hears the new list.
    options.cluster?.on('proxies', () => {
      const discovery = this.discovery();
      for (const agent of this.agents.values()) writeJsonLine(agent.control, discovery);
    });
  }

  /** The discovery message: every live Proxy of the cluster and how agents keep their tunnels. */
  discovery(): ControlMessage {
    const cluster = this.options.cluster;
    const proxies = cluster ? cluster.proxies().map((p) => ({ id: p.id, addr: p.public_addr })) : [{ id: this.proxyId, addr: this.options.publicAddr }];
    return { type: 'discovery', proxies, strategy: cluster?.strategy() ?? { type: 'agent_mesh' } };
  }

  private readonly unwatch: () => void;

  /** For the front door: a stream that is (or carries) an agent's SSH connection. */
  handle = (stream: Duplex, info: ConnInfo): void => {
    if (this.closing) {
      stream.destroy();
      return;
    }
    const tlsIdentity = peerHostIdentity(stream as TLSSocket);
    this.endpoint.inject(stream, { info, ...(tlsIdentity ? { tlsIdentity } : {}) });
  };

  list(): ConnectedAgent[] {
    return [...this.agents.values()];
  }

  get(hostId: string): ConnectedAgent | undefined {
    return this.agents.get(hostId);
  }

  private onConnection(conn: Connection, meta: TunnelMeta | undefined): void {
    const remote = meta ? `${meta.info.remoteAddress}:${meta.info.remotePort}` : 'unknown';
    let hostId: string | undefined;
    const refuse = (why: string) => this.log.warn({ remote, hostId, why }, 'agent refused');

    conn.on('authentication', (ctx) => {
      void (async () => {
        if (ctx.method !== 'publickey') return ctx.reject(['publickey']);
        const node = await this.options.auth.getNode(ctx.username).catch(() => undefined);
        if (!node?.sshPublicKey) {
          refuse('unknown host ID (never joined this cluster, or removed)');
          return ctx.reject();
        }
        if (meta?.tlsIdentity instanceof Error) {
          refuse(meta.tlsIdentity.message);
          return ctx.reject();
        }
        if (meta?.tlsIdentity && (meta.tlsIdentity.name !== ctx.username || meta.tlsIdentity.cluster !== this.options.auth.clusterName)) {
          refuse('the TLS client certificate names another host or cluster');
          return ctx.reject();
        }
        const parsed = ssh2.utils.parseKey(node.sshPublicKey);
        const key = Array.isArray(parsed) ? parsed[0] : parsed;
        if (!key || key instanceof Error) return ctx.reject();
        if (ctx.key.algo !== key.type || !ctx.key.data.equals(key.getPublicSSH())) {
          refuse('the key is not the one its host certificate certifies');
          return ctx.reject();
        }
        if (!ctx.signature) return ctx.accept(); // a query: "would this key do?"
        if (key.verify(ctx.blob!, ctx.signature, ctx.hashAlgo) !== true) {
          refuse('bad signature');
          return ctx.reject();
        }
        // Tracked before the lock check: a lock that lands while it runs still drops this tunnel.
        const identity: Identity = { kind: 'host', name: ctx.username, cluster: this.options.auth.clusterName, roles: node.roles };
        const untrack = this.options.auth.sessions.track(identity, `agent tunnel ${remote}`, (why) => {
          this.log.warn({ remote, hostId: identity.name, code: why.code, why: why.message }, 'agent tunnel dropped: identity revoked');
          conn.end();
          setTimeout(() => this.endpoint.destroy(conn), 1000).unref();
        });
        conn.once('close', untrack);
        const revoked = await this.options.auth.revocationOf(identity);
        if (revoked) {
          untrack();
          refuse(revoked.message);
          return ctx.reject();
        }
        hostId = ctx.username;
        ctx.accept();
      })().catch((err: unknown) => {
        this.log.error({ err }, 'agent authentication failed');
        ctx.reject();
      });
    });

    conn.on('request', (accept, reject, name, data) => {
      const bind = data as { bindAddr?: string; bindPort?: number };
      if (name === 'tcpip-forward' && bind.bindAddr === TUNNEL_BIND.addr) return accept?.();
      reject?.();
    });

    conn.on('ready', () => {
      const helloTimer = setTimeout(() => {
        this.log.warn({ remote, hostId }, 'agent sent no hello; closing');
        conn.end();
      }, this.options.helloTimeoutMs ?? 15_000);
      conn.on('session', (acceptSession) => {
        const session = acceptSession();
        this.endpoint.channelOpened(conn, session);
        session.on('subsystem', (acceptSub, rejectSub, subInfo) => {
          if (subInfo.name !== CONTROL_SUBSYSTEM || !acceptSub) return rejectSub?.();
          const control = acceptSub();
          readLine(control, { what: 'hello', timeoutMs: this.options.helloTimeoutMs ?? 15_000 })
            .then((line) => {
              clearTimeout(helloTimer);
              const hello = parseControlMessage(line);
              if (hello?.type !== 'hello' || hello.hostId !== hostId) throw new GatewayError('GW_ERR_TUNNEL_PROTOCOL', 'the first control message must be a hello for the authenticated host');
              this.register(conn, control, hello, remote);
            })
            .catch((err: unknown) => {
              this.log.warn({ remote, hostId, err: (err as Error).message }, 'bad control channel; closing');
              conn.end();
            });
        });
        session.on('exec', (_a, reject) => reject?.());
        session.on('shell', (_a, reject) => reject?.());
        session.on('pty', (_a, reject) => reject?.());
      });
    });
    conn.on('error', (err) => this.log.debug({ remote, hostId, err: err.message }, 'tunnel connection error'));
  }

  private register(conn: Connection, control: ServerChannel, hello: HelloMessage, remote: string): void {
    const now = new Date();
    const agent: ConnectedAgent = {
      hostId: hello.hostId,
      nodename: hello.nodename,
      services: hello.services,
      resources: normalizeResources(hello.resources),
      connectedAt: now,
      lastHeartbeat: now,
      remote,
      conn,
      control,
    };
    const previous = this.agents.get(agent.hostId);
    if (previous && previous.conn !== conn && hello.holds?.includes(this.proxyId)) {
      // The agent's pool already holds a tunnel here (it dialed a load balancer and landed on this Proxy again):
      // the live tunnel stays, with the client connections it carries; the new one is told so and closed.
      this.log.debug({ hostId: agent.hostId, remote }, 'agent already holds a tunnel to this Proxy; closing the new one');
      writeJsonLine(control, { type: 'duplicate', proxyId: this.proxyId } satisfies ControlMessage);
      control.end();
      conn.end();
      return;
    }
    if (previous && previous.conn !== conn) previous.conn.end(); // the agent reconnected: the new tunnel wins
    this.agents.set(agent.hostId, agent);
    this.log.info({ hostId: agent.hostId, nodename: agent.nodename, services: agent.services, remote }, 'agent connected');
    this.emit('agent', agent);
    const send = (m: ControlMessage) => writeJsonLine(control, m);
    send({ type: 'welcome', proxyId: this.proxyId, heartbeatIntervalMs: this.options.heartbeatIntervalMs, heartbeatCountMax: this.options.heartbeatCountMax });
    send(this.discovery());
    void this.writePresence(agent);

    let gone = false;
    const onGone = () => {
      if (gone) return;
      gone = true;
      heartbeat.stop();
      if (this.agents.get(agent.hostId) === agent) {
        this.agents.delete(agent.hostId);
        this.log.info({ hostId: agent.hostId, nodename: agent.nodename }, 'agent disconnected');
        this.emit('agent-gone', agent);
        void this.options.auth.clearPresence(agent.hostId, this.proxyId, agent.connectedAt.toISOString()).catch(() => undefined);
      }
    };
    const { heartbeatIntervalMs, heartbeatCountMax } = this.options;
    const heartbeat = new Heartbeat({
      unref: true,
      send: (seq) => send({ type: 'heartbeat', seq }),
      onSilent: (silentMs) => {
        this.log.warn({ hostId: agent.hostId, nodename: agent.nodename, silentMs }, 'agent missed its heartbeats; marking it offline');
        onGone();
        // The peer may be unreachable (no FIN will come): drop the transport now rather than wait for TCP.
        this.endpoint.destroy(conn);
      },
    });
    heartbeat.start(heartbeatIntervalMs, heartbeatIntervalMs * heartbeatCountMax);

    const onMessage = (m: ControlMessage) => {
      if (m.type === 'heartbeat') {
        agent.lastHeartbeat = new Date();
        heartbeat.heard();
        void this.writePresence(agent);
      } else if (m.type === 'event') {
        void this.options.auth.recordAgentEvent(agent.hostId, agent.nodename, m.event).catch((err: unknown) => this.log.warn({ err: (err as Error).message }, 'cannot record an agent event'));
      }
    };
    readControl(control, onMessage, (err) => {
      this.log.warn({ hostId: agent.hostId, nodename: agent.nodename, err: err.message }, 'agent broke the control protocol; closing');
      conn.end();
    });
    conn.once('close', onGone);
    conn.once('end', onGone);
    control.once('close', () => conn.end());
  }

  private async writePresence(agent: ConnectedAgent): Promise<void> {
    try {
      await this.options.auth.setPresence(
        {
          hostId: agent.hostId,
          nodename: agent.nodename,
          proxyId: this.proxyId,
          services: agent.services,
          resources: agent.resources,
          connectedAt: agent.connectedAt.toISOString(),
          lastHeartbeat: agent.lastHeartbeat.toISOString(),
        },
        this.options.heartbeatIntervalMs * (this.options.heartbeatCountMax + 1),
      );
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, 'cannot record agent presence');
    }
  }

  /**
   * Opens a connection to a resource through an agent's tunnel. Resolves with the channel once the agent has
   * connected to the resource; rejects with an error that names the resource and the agent otherwise.
   */
  dial(hostId: string, request: DialRequest): Promise<Duplex> {
    const agent = this.agents.get(hostId);
    if (!agent) return Promise.reject(new GatewayError('GW_ERR_TUNNEL_NOT_FOUND', `agent ${hostId} is not connected`));
    const [srcIp, srcPort] = splitHostPort(request.client_src);
    return new Promise<Duplex>((resolve, reject) => {
      agent.conn.forwardOut(TUNNEL_BIND.addr, TUNNEL_BIND.port, srcIp, srcPort, (err, channel) => {
        if (err) {
          reject(new GatewayError('GW_ERR_TUNNEL_DOWN', `cannot open a channel to agent "${agent.nodename}" (${hostId}): ${err.message}`));
          return;
        }
        const stream: Duplex = channel;
        writeJsonLine(stream, request);
        readLine(stream, { what: 'dial answer', timeoutMs: this.options.dialTimeoutMs ?? 30_000 })
          .then((line) => {
            const answer = JSON.parse(line) as DialAnswer;
            if (answer.ok) return resolve(stream);
            stream.destroy();
            reject(
              new GatewayError('GW_ERR_TUNNEL_DIAL_FAILED', `agent "${agent.nodename}" cannot reach ${request.service} "${request.resource}": ${answer.error.message}`, {
                details: { agent: agent.nodename, hostId, resource: request.resource, agentCode: answer.error.code },
              }),
            );
          })
          .catch((e: unknown) => {
            stream.destroy();
            reject(e instanceof GatewayError ? e : new GatewayError('GW_ERR_TUNNEL_PROTOCOL', String(e)));
          });
      });
    });
  }

  /** Graceful shutdown: tells every agent to reconnect (to another proxy, or to this one when it is back). */
  async close(): Promise<void> {
    this.closing = true;
    this.unwatch();
    for (const agent of this.agents.values()) {
      writeJsonLine(agent.control, { type: 'reconnect', reason: 'proxy shutting down' });
    }
    await new Promise((r) => setTimeout(r, 50));
    for (const agent of this.agents.values()) {
      agent.conn.end();
      await this.options.auth.clearPresence(agent.hostId, this.proxyId, agent.connectedAt.toISOString()).catch(() => undefined);
    }
    this.agents.clear();
  }
}

function splitHostPort(addr: string): [string, number] {
  const m = /^\[?([^\]]*)\]?:(\d+)$/.exec(addr);
  return m ? [m[1]!, Number(m[2])] : [addr, 0];
}

/** The host identity in a TLS client certificate, if the stream is TLS and presented one. */
function peerHostIdentity(socket: TLSSocket): { name: string; cluster: string } | Error | undefined {
  if (typeof socket.getPeerCertificate !== 'function') return undefined;
  const peer = socket.getPeerCertificate();
  if (!peer || !('raw' in peer) || !peer.raw) return undefined;
  if (!socket.authorized) return new Error(`TLS client certificate not signed by this cluster: ${String(socket.authorizationError)}`);
  try {
    const id = identityFromCert(peer.raw);
    if (id.kind !== 'host') return new Error('the TLS client certificate is not a host certificate');
    return { name: id.name, cluster: id.cluster };
  } catch (err) {
    return err as Error;
  }
}

function normalizeResources(r: Partial<AgentResources> | undefined): AgentResources {
  return {
    databases: Array.isArray(r?.databases) ? r.databases : [],
    apps: Array.isArray(r?.apps) ? r.apps : [],
    desktops: Array.isArray(r?.desktops) ? r.desktops : [],
    kube_clusters: Array.isArray(r?.kube_clusters) ? r.kube_clusters : [],
    ...(r?.node_labels ? { node_labels: r.node_labels } : {}),
    ...(typeof r?.node_host_cert === 'string' ? { node_host_cert: r.node_host_cert } : {}),
  };
}

export { PROTOCOL_VERSION };
