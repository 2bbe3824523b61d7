/**
 * The Proxy's end of reverse tunnels (the protocol: src/tunnel/), fed with streams from the front door, a registry
 * of connected agents and what they serve, and dialing through an agent's tunnel. Two protocols, by the ALPN the
 * agent and the front door agreed on:
 *
 *   v2  gateway-reversetunnel-v2 (443): frames straight over the mutual-TLS connection (src/tunnel/session.ts).
 *       The TLS client certificate, verified against the cluster's CAs, must be a host certificate of this
 *       cluster whose key is the one recorded at join.
 *   v1  gateway-reversetunnel (443, agents of earlier versions) and raw SSH on 3024: an SSH server (ssh2). The SSH
 *       user name is the agent's host ID and its key must be the one its host certificate certifies; over TLS
 *       with a client certificate, that certificate must name the same host of this cluster.
 *
 * Both register the same ConnectedAgent (its `link`: the control channel, streams, end, destroy). The agent
 * must still be a member and not locked (AuthService.revocationOf);
 * its tunnel is tracked in auth.sessions, so a lock on it drops the tunnel, and reconnects are refused while the
 * lock lasts. An agent keeps one tunnel per Proxy: a new one replaces the one it had here, unless its hello says
 * it still holds that one (holds: an agent pool behind a load balancer that landed here again), then the new
 * one is answered `duplicate` and closed. A hello with drain_previous (the agent moving to a better transport,
 * src/agent/ladder.ts) drains the one it replaces instead of closing it: new dials go to the new tunnel, the
 * streams in flight on the old one finish, and it closes when the last has (at the latest after drainCapMs,
 * TUNNEL_DRAIN_CAP_MS, or the hello's drain_ms within [1 s, TUNNEL_HANDOVER_DRAIN_MAX_MS]: a new process taking over
 * from the one before, src/handover.ts); it keeps its heartbeats meanwhile, and an agent has at most
 * TUNNEL_DRAINING_PER_AGENT_MAX draining tunnels here (beyond, the oldest is closed: a hand-over's successor that
 * then climbs the ladder does not cut the old process's sessions). Only a tunnel of the same authenticated host
 * replaces or drains one.
 * Liveness: the agent sends a heartbeat every interval; after countMax
 * intervals without one the proxy marks it offline and drops the connection. One timer of the TunnelServer
 * sends every agent its heartbeat and drops the silent ones (not one timer per agent): it sweeps
 * CHECKS_PER_INTERVAL times per interval and beats on every such sweep, so a dead agent is found within
 * deadTunnelBoundMs (src/tunnel/control.ts). The control channel is read
 * through src/tunnel/control.ts: a line over the cap closes the connection, unknown messages are ignored.
 * Rollouts (docs/upgrades.md): the hello's upgrade_group and the agent's `health` messages are checked here
 * (src/wire/autoupdate.ts checkAgentHealth; a bad one is ignored, logged once, the tunnel kept) and kept in the
 * presence this Proxy writes, at most one write per heartbeat interval for a changed health.
 */
import { randomUUID, X509Certificate } from 'node:crypto';
import { EventEmitter } from 'node:events';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import ssh2 from 'ssh2';
import type { Connection, ServerChannel } from 'ssh2';
import { checkHostCert, identityFromCert, sameSshKey, type Identity } from '../auth/pki.js';
import type { ProxyAuth } from '../auth/proxyauth.js';
import type { NodeRecord } from '../auth/records.js';
import { GatewayError, toGatewayError } from '../errors.js';
import { logger } from '../log.js';
import { clientOf, type ConnInfo } from '../mux/multiplexer.js';
import { SshEndpoint, type SshDeadlines } from '../net/ssh.js';
import { relayChannel } from '../net/sshchannel.js';
import type { ClusterView } from './cluster.js';
import { readLine, writeJsonLine } from '../stream/lines.js';
import { CHECKS_PER_INTERVAL, parseControlMessage, readControl } from '../tunnel/control.js';
import { checkAgentHealth, UPGRADE_GROUP_PATTERN, type AgentHealth } from '../wire/autoupdate.js';
import {
  CONTROL_SUBSYSTEM,
  PROTOCOL_VERSION,
  TUNNEL_ALPN_V2,
  TUNNEL_BIND,
  type AgentResources,
  type ControlMessage,
  type DialAnswer,
  type DialRequest,
  type E2ECapability,
  HELLO_SOFTWARE_MAX,
  type HelloMessage,
  type ServiceKind,
  type RenewalMessage,
  type RenewMessage,
  servicesRefusal,
  TUNNEL_DRAIN_CAP_MS,
  TUNNEL_DRAINING_PER_AGENT_MAX,
  TUNNEL_HANDOVER_DRAIN_MAX_MS,
} from '../tunnel/protocol.js';
import { TunnelSession, type TunnelStream } from '../tunnel/session.js';
import { recordProxyMissedHeartbeats, watchTunnelServer } from '../metrics/tunnels.js';
import { e2eCapabilityOf } from '../tunnel/e2e.js';
import { DataConnections } from './e2edata.js';

/** One agent's tunnel as the registry uses it, whichever protocol carries it. */
export interface AgentLink {
  readonly protocol: 1 | 2;
  /** The control channel: JSON lines both ways. */
  readonly control: Duplex;
  /** A new stream to the agent for one client connection (the caller writes the DialRequest next). */
  open(srcIp: string, srcPort: number): Promise<Duplex>;
  /** Ends the tunnel after what is queued. */
  end(): void;
  /** Drops the transport now (a peer that stopped answering sends no FIN). */
  destroy(): void;
  /** fn runs once the tunnel is gone (possibly more than once: callers guard). */
  onGone(fn: () => void): void;
}

export interface ConnectedAgent {
  hostId: string;
  nodename: string;
  services: ServiceKind[];
  resources: AgentResources;
  connectedAt: Date;
  lastHeartbeat: Date;
  remote: string;
  link: AgentLink;
  /** From the hello: the agent's software version and upgrade channel (agents of earlier versions send neither). */
  version?: string;
  channel?: string;
  /** From the hello: the agent's rollout group (checked: UPGRADE_GROUP_PATTERN; anything else is dropped). */
  upgradeGroup?: string;
  /** The agent's last health message, checked (checkAgentHealth); kept in its presence for the rollout. */
  health?: AgentHealth;
  /** From the hello of a v2 tunnel: the end-to-end capability this version understands of it (e2eCapabilityOf). */
  e2e?: E2ECapability;
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
  /** v2 streams' initial credit, both ways (src/tunnel/session.ts). */
  streamWindow?: number;
  /** How long a tunnel an agent replaced with drain_previous may drain (default TUNNEL_DRAIN_CAP_MS). */
  drainCapMs?: number;
  /** The agents' data connections for end-to-end streams (e2edata.ts); default: a registry of its own. */
  data?: DataConnections;
}

/** What the front door knows about a tunnel stream: where it came from and the TLS client certificate, if any. */
interface TunnelMeta {
  info: ConnInfo;
  tlsIdentity?: { name: string; cluster: string } | Error;
}

/** An agent in the registry, with what the heartbeat sweep needs. */
interface Registered {
  agent: ConnectedAgent;
  lastHeardMs: number;
  /** When its presence was last written (0: to write at the next sweep). */
  presenceWrittenMs: number;
  /** When this tunnel's agent last asked for a renewal (at most one ask per TUNNEL_RENEW_GAP_MS reaches the Auth Service). */
  renewAskedMs?: number;
  /** When its last host-cert was looked at (at most one per TUNNEL_RENEW_GAP_MS). */
  hostCertMs?: number;
  gone: () => void;
  /**
   * Settles once the first presence write of this tunnel has (or has failed to): its agent's events are relayed
   * after it, since a remote Auth Service takes them only from a Proxy whose presence of the agent lives.
   */
  presenceFirst?: Promise<void>;
  /** The agent's newest proof of its presence through this Proxy (presence-proof), carried with every presence write. */
  proof?: { time: string; signature: string };
  /** A health message was kept and not yet written (the sweep writes it once a heartbeat interval has passed). */
  healthDirty?: boolean;
  /** A bad health message was logged on this tunnel (once is enough). */
  healthRefused?: boolean;
  /** The client streams this Proxy opened in the tunnel and that are still open (a drain waits for them). */
  inFlight: Set<Duplex>;
  /** While draining: called whenever one of them closes. */
  onStreamGone?: () => void;
}

/**
 * Heartbeat intervals between two writes of an agent's presence. Its TTL only matters while the Proxy that wrote
 * it lives (presenceCounts: a dead Proxy's presences stop counting when its own record expires), so a heartbeat
 * does not rewrite it: at 10 000 agents and 20 s, 500 Backend writes/s became 33 (44 at the 15 s of today).
 */
export const PRESENCE_REFRESH_BEATS = 15;
/**
 * The least time between two renews of one tunnel that reach the Auth Service (which allows one renewal an hour):
 * an agent that sends renews in a loop costs a line and an answer each, not a Backend read and a log line.
 */
export const TUNNEL_RENEW_GAP_MS = 60_000;

const DEFAULT_DEADLINES: SshDeadlines = { sshHandshakeMs: 30_000, idleMs: 300_000 };

export class TunnelServer extends EventEmitter {
  readonly proxyId: string;
  private readonly agents = new Map<string, Registered>();
  /** Tunnels replaced by a move or a hand-over (drain_previous), oldest first: at most TUNNEL_DRAINING_PER_AGENT_MAX per agent. */
  private readonly draining = new Set<Registered>();
  private readonly endpoint: SshEndpoint<TunnelMeta | undefined>;
  private readonly log = logger('tunnel');
  private closing = false;
  /** The one heartbeat timer of every agent's tunnel (runs while any agent is connected). */
  private sweepTimer: NodeJS.Timeout | undefined;
  private heartbeatSeq = 0;
  private sweeps = 0;
  /** The agents connected, by protocol, at each scrape (gateway_tunnel_agents_connected). */
  private readonly unwatchMetrics = watchTunnelServer(() => [...this.agents.values()].map((e) => e.agent.link.protocol));
  /** The data connections of the v2 tunnels that take end-to-end streams (e2edata.ts). */
  readonly data: DataConnections;

  constructor(private readonly options: TunnelServerOptions) {
    super();
    this.proxyId = options.proxyId ?? randomUUID();
    this.data = options.data ?? new DataConnections({ proxyId: this.proxyId });
    this.endpoint = new SshEndpoint({
      hostKeys: [options.hostKey],
      ident: 'gateway-tunnel',
      deadlines: options.deadlines ?? DEFAULT_DEADLINES,
      onConnection: (conn, meta) => this.onConnection(conn, meta),
    });
    this.unwatch = options.auth.watchMaintenance(() => this.broadcast({ type: 'maintenance-changed' }));
    // A Proxy joined or left, or the strategy changed: every agent hears the new list.
    options.cluster?.on('proxies', () => this.broadcast(this.discovery()));
  }

  private broadcast(m: ControlMessage): void {
    for (const { agent } of this.agents.values()) writeJsonLine(agent.link.control, m);
  }

  /** The discovery message: every live Proxy of the cluster and how agents keep their tunnels. */
  discovery(): ControlMessage {
    const cluster = this.options.cluster;
    const proxies = cluster ? cluster.proxies().map((p) => ({ id: p.id, addr: p.public_addr })) : [{ id: this.proxyId, addr: this.options.publicAddr }];
    return { type: 'discovery', proxies, strategy: cluster?.strategy() ?? { type: 'agent_mesh' } };
  }

  private readonly unwatch: () => void;

  /** For the front door: a stream that is (or carries) an agent's tunnel; v2 by its TLS ALPN, else SSH. */
  handle = (stream: Duplex, info: ConnInfo): void => {
    if (this.closing) {
      stream.destroy();
      return;
    }
    if ((stream as TLSSocket).alpnProtocol === TUNNEL_ALPN_V2) return this.acceptV2(stream as TLSSocket, info);
    const tlsIdentity = peerHostIdentity(stream as TLSSocket);
    this.endpoint.inject(stream, { info, ...(tlsIdentity ? { tlsIdentity } : {}) });
  };

  /** Changes whenever an agent is added or removed: lets the Router keep its list between changes. */
  version = 0;

  list(): ConnectedAgent[] {
    return [...this.agents.values()].map((r) => r.agent);
  }

  get(hostId: string): ConnectedAgent | undefined {
    return this.agents.get(hostId)?.agent;
  }

  /**
   * An end-to-end stream of `identity` runs to agent hostId (the e2e route calls this once it splices): tracked in
   * auth.sessions, so that a lock or a removal that closes the user's sessions here also tells the agent, on its
   * tunnel's control stream (`locks`, protocol.ts), to close the user's end-to-end streams and refuse its grants.
   * Returns the untrack function: call it when the stream ends.
   */
  trackE2E(hostId: string, identity: Identity, stream?: Duplex): () => void {
    // The stream counts as in flight on the agent's tunnel here, as a tunnel stream does: a tunnel the agent replaces
    // (a hand-over, a better transport) drains until it ends instead of closing at once, which would close the
    // agent's end of it (an end-to-end stream is served by the process whose tunnel carried its e2e-open).
    const entry = this.agents.get(hostId);
    if (entry && stream && !stream.destroyed) {
      entry.inFlight.add(stream);
      stream.once('close', () => {
        entry.inFlight.delete(stream);
        entry.onStreamGone?.();
      });
    }
    return this.options.auth.sessions.track(identity, `end-to-end stream to agent ${hostId}`, (reason) => {
      const entry = this.agents.get(hostId);
      if (entry) writeJsonLine(entry.agent.link.control, { type: 'locks', users: [identity.name], reason: reason.message.slice(0, 1024), at: Date.now() } satisfies ControlMessage);
    });
  }

  /** How many agents hold a tunnel of each protocol (tests, benchmarks). */
  protocols(): { v1: number; v2: number } {
    let v2 = 0;
    for (const { agent } of this.agents.values()) if (agent.link.protocol === 2) v2++;
    return { v1: this.agents.size - v2, v2 };
  }

  // --- v2: frames over mutual TLS ------------------------------------------------------------------------------

  private acceptV2(socket: TLSSocket, info: ConnInfo): void {
    const remote = clientOf(info);
    const link = new SessionLink(socket, this.options.streamWindow, (err) => {
      if (err) this.log.warn({ remote, err: err.message }, 'agent broke the tunnel protocol; closing');
    });
    const timeoutMs = this.options.helloTimeoutMs ?? 15_000;
    const hello = readLine(link.control, { what: 'hello', timeoutMs }).then((line) => parseControlMessage(line));
    hello.catch(() => undefined); // read below, after the authentication
    this.authenticateV2(socket, remote, link)
      .then(async (host) => {
        const m = host && (await hello);
        if (host && m?.type === 'hello' && m.hostId === host.hostId && this.servicesRefused(host.roles, m, remote)) host = undefined;
        if (host === undefined) {
          writeJsonLine(link.control, { type: 'refused' } satisfies ControlMessage);
          link.end();
          return;
        }
        if (m?.type !== 'hello' || m.hostId !== host.hostId) throw new GatewayError('GW_ERR_TUNNEL_PROTOCOL', 'the first control message must be a hello for the authenticated host');
        this.register(link, m, remote);
      })
      .catch((err: unknown) => {
        this.log.warn({ remote, err: (err as Error).message }, 'bad control channel; closing');
        link.end();
      });
  }

  /**
   * The agent of a v2 tunnel: its TLS client certificate must be a host certificate of this cluster (verified by
   * the front door against the cluster's CAs) for a host that joined with this very key, and is neither removed
   * nor locked. Resolves with its host ID, or undefined when refused (the reason is logged).
   */
  private async authenticateV2(socket: TLSSocket, remote: string, link: AgentLink): Promise<{ hostId: string; roles: string[] } | undefined> {
    const tlsIdentity = peerHostIdentity(socket);
    let hostId: string | undefined;
    const refuse = (why: string) => {
      this.log.warn({ remote, hostId, why }, 'agent refused');
      return undefined;
    };
    if (!tlsIdentity) return refuse('no TLS client certificate');
    if (tlsIdentity instanceof Error) return refuse(tlsIdentity.message);
    hostId = tlsIdentity.name;
    if (tlsIdentity.cluster !== this.options.auth.clusterName) return refuse(`the TLS client certificate is of cluster "${tlsIdentity.cluster}"`);
    const node = await this.options.auth.getNode(hostId).catch(() => undefined);
    if (!node?.sshPublicKey) return refuse('unknown host ID (never joined this cluster, or removed)');
    if (!sameKey(socket, node.sshPublicKey)) return refuse('the key is not the one its host certificate certifies');
    const identity: Identity = { kind: 'host', name: hostId, cluster: this.options.auth.clusterName, roles: node.roles };
    const revoked = await this.trackAgent(identity, remote, link);
    return revoked ? refuse(revoked.message) : { hostId, roles: node.roles };
  }

  /**
   * Whether the hello names services the host's roles (its node record: what its join token allowed) do not let it
   * serve, or the host is no agent at all (a Proxy's identity): then the tunnel is refused (logged), so that no
   * host poses as another kind of member (tunnel/protocol.ts servicesRefusal).
   */
  private servicesRefused(roles: readonly string[], hello: HelloMessage, remote: string): boolean {
    const why = servicesRefusal(roles, Array.isArray(hello.services) ? hello.services : []);
    if (why) this.log.warn({ remote, hostId: hello.hostId, services: hello.services, roles, why }, 'agent refused');
    return why !== undefined;
  }

  /**
   * Tracks the agent's tunnel in auth.sessions (a lock drops it) before the lock check, so that a lock landing
   * while the check runs still drops it. Why the identity is revoked now (then it is not tracked), if it is.
   */
  private async trackAgent(identity: Identity, remote: string, link: Pick<AgentLink, 'end' | 'destroy' | 'onGone'>): Promise<GatewayError | undefined> {
    const untrack = this.options.auth.sessions.track(identity, `agent tunnel ${remote}`, (why) => {
      this.log.warn({ remote, hostId: identity.name, code: why.code, why: why.message }, 'agent tunnel dropped: identity revoked');
      link.end();
      setTimeout(() => link.destroy(), 1000).unref();
    });
    link.onGone(untrack);
    const revoked = await this.options.auth.revocationOf(identity);
    if (revoked) untrack();
    return revoked;
  }

  // --- v1: SSH ---------------------------------------------------------------------------------------------------

  private onConnection(conn: Connection, meta: TunnelMeta | undefined): void {
    const remote = meta ? `${meta.info.remoteAddress}:${meta.info.remotePort}` : 'unknown';
    const state: { hostId?: string; roles?: string[]; link?: SshLink } = {};
    conn.on('authentication', (ctx) => {
      this.authenticateSsh(conn, ctx, meta, remote)
        .then((host) => {
          if (host === undefined) return ctx.reject(ctx.method === 'publickey' ? undefined : ['publickey']);
          if (host === '') return ctx.accept(); // a query: "would this key do?"
          state.hostId = host.hostId;
          state.roles = host.roles;
          ctx.accept();
        })
        .catch((err: unknown) => {
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
        this.log.warn({ remote, hostId: state.hostId }, 'agent sent no hello; closing');
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
              if (hello?.type !== 'hello' || hello.hostId !== state.hostId) throw new GatewayError('GW_ERR_TUNNEL_PROTOCOL', 'the first control message must be a hello for the authenticated host');
              if (this.servicesRefused(state.roles ?? [], hello, remote)) return conn.end();
              this.register(new SshLink(conn, control, this.endpoint), hello, remote);
            })
            .catch((err: unknown) => {
              this.log.warn({ remote, hostId: state.hostId, err: (err as Error).message }, 'bad control channel; closing');
              conn.end();
            });
        });
        session.on('exec', (_a, reject) => reject?.());
        session.on('shell', (_a, reject) => reject?.());
        session.on('pty', (_a, reject) => reject?.());
      });
    });
    conn.on('error', (err) => this.log.debug({ remote, hostId: state.hostId, err: err.message }, 'tunnel connection error'));
  }

  /**
   * One SSH authentication attempt: the host ID and its roles when accepted, '' for a key query that may go on, undefined when
   * refused (logged, but for a method other than publickey).
   */
  private async authenticateSsh(conn: Connection, ctx: ssh2.AuthContext, meta: TunnelMeta | undefined, remote: string): Promise<{ hostId: string; roles: string[] } | '' | undefined> {
    if (ctx.method !== 'publickey') return undefined;
    const refuse = (why: string) => {
      this.log.warn({ remote, hostId: ctx.username, why }, 'agent refused');
      return undefined;
    };
    const node = await this.options.auth.getNode(ctx.username).catch(() => undefined);
    if (!node?.sshPublicKey) return refuse('unknown host ID (never joined this cluster, or removed)');
    if (meta?.tlsIdentity instanceof Error) return refuse(meta.tlsIdentity.message);
    if (meta?.tlsIdentity && (meta.tlsIdentity.name !== ctx.username || meta.tlsIdentity.cluster !== this.options.auth.clusterName)) {
      return refuse('the TLS client certificate names another host or cluster');
    }
    const parsed = ssh2.utils.parseKey(node.sshPublicKey);
    const key = Array.isArray(parsed) ? parsed[0] : parsed;
    if (!key || key instanceof Error) return undefined;
    if (ctx.key.algo !== key.type || !ctx.key.data.equals(key.getPublicSSH())) return refuse('the key is not the one its host certificate certifies');
    if (!ctx.signature) return '';
    if (key.verify(ctx.blob!, ctx.signature, ctx.hashAlgo) !== true) return refuse('bad signature');
    const identity: Identity = { kind: 'host', name: ctx.username, cluster: this.options.auth.clusterName, roles: node.roles };
    const link = { end: () => conn.end(), destroy: () => this.endpoint.destroy(conn), onGone: (fn: () => void) => void conn.once('close', fn) };
    const revoked = await this.trackAgent(identity, remote, link);
    return revoked ? refuse(revoked.message) : { hostId: ctx.username, roles: node.roles };
  }

  // --- the registry and the control protocol ------------------------------------------------------------------

  private register(link: AgentLink, hello: HelloMessage, remote: string): void {
    const now = new Date();
    const agent: ConnectedAgent = {
      hostId: hello.hostId,
      nodename: hello.nodename,
      services: hello.services,
      resources: normalizeResources(hello.resources),
      connectedAt: now,
      lastHeartbeat: now,
      remote,
      link,
      ...softwareOf(hello),
    };
    const previous = this.agents.get(agent.hostId);
    if (previous && hello.holds?.includes(this.proxyId)) {
      // The agent's pool already holds a tunnel here (it dialed a load balancer and landed on this Proxy again):
      // the live tunnel stays, with the client connections it carries; the new one is told so and closed.
      this.log.debug({ hostId: agent.hostId, remote }, 'agent already holds a tunnel to this Proxy; closing the new one');
      writeJsonLine(link.control, { type: 'duplicate', proxyId: this.proxyId } satisfies ControlMessage);
      link.control.end();
      link.end();
      return;
    }
    if (previous && hello.drain_previous === true) this.drain(previous, drainCapOf(hello, this.options.drainCapMs ?? TUNNEL_DRAIN_CAP_MS));
    else if (previous) previous.agent.link.end(); // the agent reconnected: the new tunnel wins
    let gone = false;
    const entry: Registered = {
      agent,
      inFlight: new Set(),
      lastHeardMs: now.getTime(),
      presenceWrittenMs: now.getTime(),
      gone: () => {
        if (gone) return;
        gone = true;
        this.unregister(entry);
      },
    };
    this.agents.set(agent.hostId, entry);
    this.version++;
    this.log.info({ hostId: agent.hostId, nodename: agent.nodename, services: agent.services, remote, protocol: link.protocol }, 'agent connected');
    this.emit('agent', agent);
    const send = (m: ControlMessage) => writeJsonLine(link.control, m);
    this.attachData(link, hello, agent);
    send({ type: 'welcome', proxyId: this.proxyId, heartbeatIntervalMs: this.options.heartbeatIntervalMs, heartbeatCountMax: this.options.heartbeatCountMax });
    send(this.discovery());
    // An agent that signs its presence sends its first proof right after the welcome: its presence is written with
    // it (or at the next sweep, should none come); others' at once.
    if (hello.signs_presence === true) entry.presenceWrittenMs = 0;
    else entry.presenceFirst = this.writePresence(entry);
    this.startSweep();
    readControl(
      link.control,
      (m) => this.onControlMessage(entry, m),
      (err) => {
        this.log.warn({ hostId: agent.hostId, nodename: agent.nodename, err: err.message }, 'agent broke the control protocol; closing');
        link.end();
      },
    );
    link.onGone(entry.gone);
  }

  private onControlMessage(entry: Registered, m: ControlMessage): void {
    const { agent } = entry;
    if (m.type === 'heartbeat') {
      entry.lastHeardMs = Date.now();
      agent.lastHeartbeat = new Date(entry.lastHeardMs);
    } else if (m.type === 'event') {
      void (entry.presenceFirst ?? Promise.resolve()).then(() => this.options.auth.recordAgentEvent(agent.hostId, agent.nodename, m.event, this.proxyId)).catch((err: unknown) => this.log.warn({ err: (err as Error).message }, 'cannot record an agent event'));
    } else if (m.type === 'renew') {
      void this.renew(entry, m);
    } else if (m.type === 'host-cert') {
      void this.takeHostCert(entry, m.ssh_cert.trim());
    } else if (m.type === 'health') {
      this.takeHealth(entry, m.health);
    } else if (m.type === 'presence-proof' && m.proxyId === this.proxyId) {
      const first = entry.proof === undefined;
      entry.proof = { time: m.time, signature: m.signature };
      // The first one: write the presence again with it (the write at registration had none, and a remote Auth
      // Service refuses an agent that has signed before without it); the agent's events wait for this write.
      if (first) entry.presenceFirst = this.writePresence(entry);
    }
  }

  /**
   * An agent's health (protocol.ts `health`): kept, and its presence written at once, when checkAgentHealth takes
   * it; a bad one is ignored (the previous stays), logged once per tunnel, and the tunnel kept: a broken reporter
   * must not cut an agent's users off. At most one write per heartbeat interval: a faster agent's messages only
   * replace the one kept, which the next sweep writes.
   */
  private takeHealth(entry: Registered, value: unknown): void {
    const checked = checkAgentHealth(value, Date.now());
    if (!checked.ok) {
      if (!entry.healthRefused) this.log.warn({ hostId: entry.agent.hostId, nodename: entry.agent.nodename, why: checked.why }, 'ignoring a bad health message from an agent (logged once per tunnel)');
      entry.healthRefused = true;
      return;
    }
    entry.agent.health = checked.health;
    entry.healthDirty = true;
    // An agent that signs its presence has it written with its first proof (presenceWrittenMs is 0 until then).
    if (entry.presenceWrittenMs !== 0 && Date.now() - entry.presenceWrittenMs >= this.options.heartbeatIntervalMs) void this.writePresence(entry);
  }

  /**
   * An agent's renewed SSH host certificate (its next hello carries it too), taken into its resources and presence
   * only when the cluster's host CA signed it for this tunnel's host and the key the host joined with, and it is
   * valid now; an agent that serves no SSH has none to replace. One per TUNNEL_RENEW_GAP_MS per tunnel is looked at.
   */
  private async takeHostCert(entry: Registered, line: string): Promise<void> {
    const { agent } = entry;
    const now = Date.now();
    if (agent.resources.node_host_cert === undefined || (entry.hostCertMs !== undefined && now - entry.hostCertMs < TUNNEL_RENEW_GAP_MS)) return;
    entry.hostCertMs = now;
    let node: NodeRecord | undefined;
    try {
      node = await this.options.auth.getNode(agent.hostId);
    } catch (err) {
      entry.hostCertMs = undefined; // the Backend, not the certificate: the next one is looked at
      this.log.warn({ hostId: agent.hostId, err: (err as Error).message }, "cannot check the agent's new SSH host certificate");
      return;
    }
    // Against the cluster's host CA and the key the host joined with.
    const checked = node?.sshPublicKey ? checkHostCert(line, { caKey: this.options.auth.host.ssh.publicKey, hostId: agent.hostId, sshKey: node.sshPublicKey, now }) : { refusal: 'the node record holds no key' };
    if ('refusal' in checked) {
      this.log.warn({ hostId: agent.hostId, why: checked.refusal }, "agent's new SSH host certificate not taken");
      return;
    }
    agent.resources.node_host_cert = line;
    this.version++;
    void this.writePresence(entry);
  }

  /**
   * An agent's renew, for the host ID this tunnel authenticated (never one the agent names), answered on its
   * control channel. One per TUNNEL_RENEW_GAP_MS per tunnel reaches the Auth Service; the others are answered too
   * soon at once (also while the first still runs).
   */
  private async renew(entry: Registered, m: RenewMessage): Promise<void> {
    const { agent } = entry;
    const answer = (body: Omit<RenewalMessage, 'type' | 'id'>): void => void writeJsonLine(agent.link.control, { type: 'renewal', id: m.id, ...body } satisfies ControlMessage);
    const now = Date.now();
    if (entry.renewAskedMs !== undefined && now - entry.renewAskedMs < TUNNEL_RENEW_GAP_MS) {
      return answer({ error: new GatewayError('GW_ERR_HOST_RENEW_TOO_SOON', `this tunnel asked for a renewal less than ${TUNNEL_RENEW_GAP_MS / 1000} s ago`).toJSON() });
    }
    entry.renewAskedMs = now;
    try {
      const bundle = await this.options.auth.renewHost({ hostId: agent.hostId, publicKeyPem: m.public_key, via: this.proxyId, carried: { proof: m.proof } });
      answer({ certs: { tls_cert: bundle.tlsCert, ssh_cert: bundle.sshCert } });
    } catch (err) {
      const e = toGatewayError(err);
      this.log.warn({ hostId: agent.hostId, code: e.code, err: e.message }, 'agent renewal not answered with certificates');
      answer({ error: e.toJSON() });
    }
  }

  /**
   * The agent moved this tunnel to a better transport: it leaves the registry (the caller registers the new one),
   * and closes once its streams in flight have closed, or at the drain cap. Heartbeats go on meanwhile (sweep).
   */
  private drain(entry: Registered, capMs: number): void {
    const { hostId, nodename } = entry.agent;
    const mine = [...this.draining].filter((e) => e.agent.hostId === hostId);
    // A bounded number per agent: beyond it the oldest is closed (an agent that keeps moving cannot pile them up).
    for (const older of mine.slice(0, Math.max(0, mine.length - TUNNEL_DRAINING_PER_AGENT_MAX + 1))) {
      this.draining.delete(older);
      older.agent.link.end();
    }
    this.draining.add(entry);
    let closed = false;
    const close = (why: string) => {
      if (closed) return;
      closed = true;
      clearTimeout(cap);
      entry.onStreamGone = undefined;
      this.draining.delete(entry);
      this.log.info({ hostId, nodename, why, streams: entry.inFlight.size }, 'drained tunnel closed');
      entry.agent.link.end();
    };
    const cap = setTimeout(() => close(`the drain cap (${capMs} ms) was reached`), capMs);
    cap.unref();
    entry.onStreamGone = () => {
      if (entry.inFlight.size === 0) close('its last stream closed');
    };
    entry.agent.link.onGone(() => close('the agent closed it'));
    this.log.info({ hostId, nodename, streams: entry.inFlight.size, capMs }, 'agent replaced its tunnel (a better transport, or a new process); draining the old one');
    if (entry.inFlight.size === 0) close('no stream was open');
  }

  /** A v2 tunnel whose hello offers end-to-end streams: its data connections are registered (e2edata.ts). */
  private attachData(link: AgentLink, hello: HelloMessage, agent: ConnectedAgent): void {
    // The hello's e2e field is read as unknown: e2eCapabilityOf keeps only a capability this version understands.
    const capability = e2eCapabilityOf((hello as { e2e?: unknown }).e2e);
    if (!(link instanceof SessionLink) || !capability) return;
    agent.e2e = capability;
    this.data.attach({ hostId: agent.hostId, nodename: agent.nodename, socket: link.socket, capability, send: (m) => writeJsonLine(link.control, m), openStream: () => link.open(), onGone: (fn) => link.onGone(fn) });
  }

  private unregister(entry: Registered): void {
    const { agent } = entry;
    if (this.agents.get(agent.hostId) !== entry) return;
    this.agents.delete(agent.hostId);
    this.version++;
    if (this.agents.size === 0) this.stopSweep();
    this.log.info({ hostId: agent.hostId, nodename: agent.nodename }, 'agent disconnected');
    this.emit('agent-gone', agent);
    void this.options.auth.clearPresence(agent.hostId, this.proxyId, agent.connectedAt.toISOString()).catch(() => undefined);
  }

  private startSweep(): void {
    if (this.sweepTimer || this.closing) return;
    this.sweepTimer = setInterval(() => this.sweep(), this.options.heartbeatIntervalMs / CHECKS_PER_INTERVAL);
    this.sweepTimer.unref();
  }

  private stopSweep(): void {
    if (this.sweepTimer) clearInterval(this.sweepTimer);
    this.sweepTimer = undefined;
  }

  /**
   * CHECKS_PER_INTERVAL times per interval: the agents silent for the whole window are dropped; on every such
   * sweep, a heartbeat to each agent.
   */
  private sweep(): void {
    const now = Date.now();
    const silentAfterMs = this.options.heartbeatIntervalMs * this.options.heartbeatCountMax;
    const refreshMs = this.options.heartbeatIntervalMs * PRESENCE_REFRESH_BEATS;
    const beats = ++this.sweeps % CHECKS_PER_INTERVAL === 0;
    const beat = beats ? `${JSON.stringify({ type: 'heartbeat', seq: ++this.heartbeatSeq } satisfies ControlMessage)}\n` : '';
    for (const entry of [...this.agents.values()]) {
      const silentMs = now - entry.lastHeardMs;
      if (silentMs <= silentAfterMs) {
        if (beats) entry.agent.link.control.write(beat);
        const due = entry.healthDirty === true && entry.presenceWrittenMs !== 0 ? this.options.heartbeatIntervalMs : refreshMs;
        if (now - entry.presenceWrittenMs >= due) void this.writePresence(entry);
        continue;
      }
      this.log.warn({ hostId: entry.agent.hostId, nodename: entry.agent.nodename, silentMs }, 'agent missed its heartbeats; marking it offline');
      recordProxyMissedHeartbeats(entry.agent.link.protocol);
      entry.gone();
      // The peer may be unreachable (no FIN will come): drop the transport now rather than wait for TCP.
      entry.agent.link.destroy();
    }
    // Draining tunnels keep their heartbeats (the agent watches them too) and are dropped when silent.
    for (const entry of [...this.draining]) {
      if (now - entry.lastHeardMs <= silentAfterMs) {
        if (beats) entry.agent.link.control.write(beat);
        continue;
      }
      this.draining.delete(entry);
      entry.agent.link.destroy();
    }
  }

  /** Writes the agent's presence (a failed write is tried again at the next sweep). */
  private async writePresence(entry: Registered): Promise<void> {
    const { agent } = entry;
    entry.presenceWrittenMs = Date.now();
    entry.healthDirty = false;
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
          ...(agent.version === undefined ? {} : { version: agent.version }),
          ...(agent.channel === undefined ? {} : { channel: agent.channel }),
          ...(agent.upgradeGroup === undefined ? {} : { upgradeGroup: agent.upgradeGroup }),
          ...(agent.health === undefined ? {} : { health: agent.health }),
          ...(entry.proof === undefined ? {} : { proof: entry.proof }),
          // Written by a Proxy whose peering listener takes end-to-end streams (peer.ts): other Proxies may grant them.
          ...(agent.e2e === undefined ? {} : { e2e: agent.e2e }),
        },
        this.options.heartbeatIntervalMs * (PRESENCE_REFRESH_BEATS + this.options.heartbeatCountMax + 1),
      );
      // The tunnel closed (or was replaced) while this write was in flight: the record written must not outlive it.
      const current = this.agents.get(agent.hostId);
      if (current === entry) return;
      if (current) await this.writePresence(current);
      else await this.options.auth.clearPresence(agent.hostId, this.proxyId, agent.connectedAt.toISOString());
    } catch (err) {
      entry.presenceWrittenMs = 0;
      this.log.warn({ err: (err as Error).message }, 'cannot record agent presence');
    }
  }

  /**
   * Opens a connection to a resource through an agent's tunnel. Resolves with the stream once the agent has
   * connected to the resource; rejects with an error that names the resource and the agent otherwise.
   */
  async dial(hostId: string, request: DialRequest): Promise<Duplex> {
    const entry = this.agents.get(hostId);
    if (!entry) throw new GatewayError('GW_ERR_TUNNEL_NOT_FOUND', `agent ${hostId} is not connected`);
    const { agent } = entry;
    const [srcIp, srcPort] = splitHostPort(request.client_src);
    let stream: Duplex;
    try {
      stream = await agent.link.open(srcIp, srcPort);
    } catch (err) {
      throw new GatewayError('GW_ERR_TUNNEL_DOWN', `cannot open a channel to agent "${agent.nodename}" (${hostId}): ${(err as Error).message}`);
    }
    entry.inFlight.add(stream);
    stream.once('close', () => {
      entry.inFlight.delete(stream);
      entry.onStreamGone?.();
    });
    writeJsonLine(stream, request);
    let answer: DialAnswer;
    try {
      const line = await readLine(stream, { what: 'dial answer', timeoutMs: this.options.dialTimeoutMs ?? 30_000 });
      answer = JSON.parse(line) as DialAnswer;
    } catch (e) {
      stream.destroy();
      // A v2 stream the agent reset says why (too many streams on the tunnel, for one).
      const reset = (stream as Partial<TunnelStream>).resetReason;
      if (reset !== undefined) throw new GatewayError('GW_ERR_TUNNEL_DIAL_FAILED', `agent "${agent.nodename}" reset the stream to ${request.service} "${request.resource}": ${reset}`);
      throw e instanceof GatewayError ? e : new GatewayError('GW_ERR_TUNNEL_PROTOCOL', String(e));
    }
    if (answer.ok) return stream;
    stream.destroy();
    // A draining agent (stopping, or handing over to a successor not yet here) is not a path failure: its own code.
    if (answer.error.code === 'GW_ERR_AGENT_DRAINING') {
      throw new GatewayError('GW_ERR_AGENT_DRAINING', `agent "${agent.nodename}" is stopping: ${answer.error.message}`, { details: { agent: agent.nodename, hostId } });
    }
    throw new GatewayError('GW_ERR_TUNNEL_DIAL_FAILED', `agent "${agent.nodename}" cannot reach ${request.service} "${request.resource}": ${answer.error.message}`, {
      details: { agent: agent.nodename, hostId, resource: request.resource, agentCode: answer.error.code },
    });
  }

  /** Graceful shutdown: tells every agent to reconnect (to another proxy, or to this one when it is back). */
  async close(): Promise<void> {
    this.closing = true;
    this.stopSweep();
    this.unwatch();
    this.unwatchMetrics();
    this.broadcast({ type: 'reconnect', reason: 'proxy shutting down' });
    await new Promise((r) => setTimeout(r, 50));
    for (const { agent } of this.draining) agent.link.end();
    this.draining.clear();
    for (const { agent } of this.agents.values()) {
      agent.link.end();
      await this.options.auth.clearPresence(agent.hostId, this.proxyId, agent.connectedAt.toISOString()).catch(() => undefined);
    }
    this.agents.clear();
    this.data.close();
    this.version++;
  }
}

/** v1: an SSH connection and its control channel; a stream is a forwarded-tcpip channel. */
class SshLink implements AgentLink {
  readonly protocol = 1;

  constructor(
    private readonly conn: Connection,
    readonly control: ServerChannel,
    private readonly endpoint: SshEndpoint<TunnelMeta | undefined>,
  ) {
    control.once('close', () => conn.end());
  }

  open(srcIp: string, srcPort: number): Promise<Duplex> {
    return new Promise((resolve, reject) => this.conn.forwardOut(TUNNEL_BIND.addr, TUNNEL_BIND.port, srcIp, srcPort, (err, channel) => (err ? reject(err) : resolve(relayChannel(channel)))));
  }

  end(): void {
    this.conn.end();
  }

  destroy(): void {
    this.endpoint.destroy(this.conn);
  }

  onGone(fn: () => void): void {
    this.conn.once('close', fn);
    this.conn.once('end', fn);
  }
}

/** v2: a TunnelSession on the TLS socket. */
class SessionLink implements AgentLink {
  readonly protocol = 2;
  readonly control: Duplex;
  private readonly session: TunnelSession;
  private goneFns: Array<() => void> | undefined = [];

  constructor(readonly socket: TLSSocket, window: number | undefined, onProtocolError: (err: GatewayError | undefined) => void) {
    this.session = new TunnelSession(socket, {
      role: 'proxy',
      ...(window ? { window } : {}),
      onClose: (err) => {
        onProtocolError(err);
        const fns = this.goneFns;
        this.goneFns = undefined;
        for (const fn of fns ?? []) fn();
      },
    });
    this.control = this.session.control;
  }

  open(): Promise<Duplex> {
    return Promise.resolve(this.session.openStream());
  }

  end(): void {
    this.session.end();
  }

  destroy(): void {
    this.session.destroy();
  }

  onGone(fn: () => void): void {
    if (this.goneFns) this.goneFns.push(fn);
    else fn();
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

/** Whether the TLS client certificate's key is the SSH public key recorded when the host joined. */
function sameKey(socket: TLSSocket, sshPublicKey: string): boolean {
  try {
    return sameSshKey(new X509Certificate(socket.getPeerCertificate().raw).publicKey.export({ type: 'spki', format: 'pem' }).toString(), sshPublicKey);
  } catch {
    return false;
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

/** The hello's software fields, kept only when they are short printable strings (anything else is dropped). */
function softwareOf(hello: HelloMessage): { version?: string; channel?: string; upgradeGroup?: string } {
  const ok = (v: unknown): v is string => typeof v === 'string' && v.length > 0 && v.length <= HELLO_SOFTWARE_MAX && /^[\x21-\x7e]+$/.test(v);
  const group = hello.upgrade_group;
  return {
    ...(ok(hello.software_version) ? { version: hello.software_version } : {}),
    ...(ok(hello.upgrade_channel) ? { channel: hello.upgrade_channel } : {}),
    ...(typeof group === 'string' && UPGRADE_GROUP_PATTERN.test(group) ? { upgradeGroup: group } : {}),
  };
}

/**
 * How long the tunnel a hello replaces may drain: its drain_ms (a new process's gateway.drain_limit) kept within
 * [1 s, TUNNEL_HANDOVER_DRAIN_MAX_MS], else the Proxy's cap. Pure.
 */
export function drainCapOf(hello: Pick<HelloMessage, 'drain_ms'>, fallbackMs: number): number {
  const asked = hello.drain_ms;
  if (typeof asked !== 'number' || !Number.isFinite(asked)) return fallbackMs;
  return Math.min(Math.max(Math.floor(asked), 1_000), TUNNEL_HANDOVER_DRAIN_MAX_MS);
}
