/**
 * The agent side of the reverse tunnel: dial out to the Proxy (through the Dialer, so through HTTPS_PROXY),
 * keep one tunnel up, heartbeat, and serve the connections the Proxy forwards by connecting to the resource
 * each dial request names.
 *
 *   find     GET /webapi/find on the Proxy (TLS verified against the cluster's host CA, host certificate with the
 *            role proxy: src/client/api.ts memberIdentity); the answer is kept for later attempts until one
 *            fails before the tunnel is up
 *   dial     the rungs of the transport ladder (src/agent/ladder.ts decides which, and when to fall or climb):
 *            alpn, the web address offering ALPN gateway-reversetunnel-v2 then gateway-reversetunnel (TLS client
 *            cert = host cert; the Proxy's certificate must be from the cluster's host CA, role proxy); tunnel-port,
 *            raw SSH to ssh_tunnel_public_addr; upgrade, the same TLS inside the stream openUpgrade gives
 *   v2       the Proxy chose gateway-reversetunnel-v2: frames over that TLS connection (src/tunnel/session.ts),
 *            the agent authenticated by its certificate alone; a refusal arrives as `refused`
 *   ssh      otherwise (a Proxy of an earlier version, or 3024): SSH, user = host ID, key = the host key; on raw
 *            SSH the Proxy's SSH host key must be the one /webapi/find lists
 *   control  hello, heartbeats and audit events out; welcome, discovery, maintenance-changed and reconnect in
 *            (read through src/tunnel/control.ts: a line over the cap drops the tunnel, unknown lines are ignored)
 *   retry    TUNNEL_RETRY (src/backoff.ts): first retry within 0.25-0.5 s, doubling, capped at 5 s, equal
 *            jitter; a welcome starts it again once that tunnel stayed up 10 s. A reconnect notice from a Proxy
 *            that shuts down gracefully retries at once
 *
 * One TunnelAgent keeps one tunnel. Several Proxies behind a load balancer: src/agent/pool.ts runs one per
 * tunnel and gives each the Proxies the others hold (`holds`, sent in the hello: a Proxy already holding this
 * agent answers `duplicate` instead of replacing that tunnel), a shared dial rate (`gate`), and drop() for a
 * tunnel it no longer wants. The Proxy a tunnel reached (proxyId) is the host ID its proxy-role certificate names
 * (on raw SSH: the Proxy /webapi/find lists for its host key); a welcome naming another is refused, and streams are
 * served only after a welcome that names it.
 *
 * A probe of a resource (`gwctl probe`, a DialRequest with probe: true, src/tunnel/protocol.ts; not the pool's probe
 * of a better rung, below): the agent only checks that the resource answers (reachResource: connect and close),
 * answers, writes one ProbeReport line and ends the stream.
 *
 * Moving (the pool's, src/agent/pool.ts): a probe is a TunnelAgent limited to the better rungs that tries once
 * (probe) and says drain_previous in its hello; once it is welcomed it is promoted to an ordinary tunnel, and the
 * one it replaced is drained (drain()): no retry, its streams in flight finish, then it closes (at the latest
 * after the drain cap).
 */
import { X509Certificate } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { readFileSync } from 'node:fs';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import type ssh2 from 'ssh2';
import { parseAddr } from '../addr.js';
import { Backoff, type BackoffDeps, type BackoffPolicy } from '../backoff.js';
import { PRESENCE_PROOF_EVERY_MS, signPresenceProof, signRenewProof, sshPrivateKeyPem } from '../auth/pki.js';
import { ApiClient, memberIdentity, proxyServerIdentity } from '../client/api.js';
import type { Dialer } from '../dial/dialer.js';
import { tlsVerifyError, UNTRUSTED_HINTS } from '../dial/tlsverify.js';
import { GatewayError, toGatewayError } from '../errors.js';
import { logger } from '../log.js';
import { recordAgentMissedHeartbeats, recordAgentReconnect, recordAgentTunnelUp } from '../metrics/tunnels.js';
import { FIND_PATH, type FindResponse } from '../wire/ping.js';
import { readJsonLine, writeJsonLine } from '../stream/lines.js';
import { FramedStream } from '../stream/framed.js';
import { splice } from '../stream/splice.js';
import { relayChannel } from '../net/sshchannel.js';
import { peerX509 } from '../net/tls.js';
import { connectTls } from '../stream/tls.js';
import { Heartbeat, readControl } from '../tunnel/control.js';
import {
  CONTROL_SUBSYSTEM,
  PROTOCOL_VERSION,
  TUNNEL_ALPN_V1,
  TUNNEL_ALPN_V2,
  TUNNEL_BIND,
  type AgentResources,
  type ControlMessage,
  type DatabaseInfo,
  type DialAnswer,
  type DialRequest,
  type E2EOpenMessage,
  type ProbeReport,
  type ServiceKind,
} from '../tunnel/protocol.js';
import { TunnelSession, type TunnelStream } from '../tunnel/session.js';
import { parseEndpoint } from '../upgrade/endpoint.js';
import { resolveSettings } from '../upgrade/settings.js';
import type { HopSpan } from '../trace.js';
import { VERSION } from '../version.js';
import { gateDatabase } from './dbgate.js';
import { DataPools, type DataDialer, type DataPoolOptions, type DataTunnelHandle } from './e2edata.js';
import { E2EStreams, type E2ETunnel } from './e2estream.js';
import { DATA_POOL_MAX, dataKeyOf } from '../tunnel/e2e.js';
import { startAgentDial } from './dialhop.js';
import type { HostIdentity } from './identity.js';
import { fallReason, fallsThrough, Ladder, rungsOf, type Rung, type RungName } from './ladder.js';
import { PendingRenewals, type RenewedCerts } from './renewal.js';
import type { AgentHealth } from '../wire/autoupdate.js';

/**
 * ssh2, loaded only for a tunnel that speaks SSH (v1: a Proxy of an earlier version, or raw SSH on 3024): v2 needs
 * none of it, and loading it took some 20 ms of an agent's start (docs/architecture.md, "Start-up").
 */
let sshModule: typeof ssh2 | undefined;

/**
 * The retry of a tunnel that is down (docs/retries.md, "Retries"): the first within 0.25-0.5 s, doubling,
 * capped at 5 s, equal jitter (many agents that lost one Proxy come back spread out). A welcome resets it only
 * if the tunnel then stayed up for resetAfterMs: a Proxy that welcomes and drops at once (crashing, or broken
 * behind its balancer) is retried at the cap, not every 0.25-0.5 s.
 */
export const TUNNEL_RETRY: BackoffPolicy = { firstMs: 500, maxMs: 5_000, jitter: 'equal', resetAfterMs: 10_000 };

/** How long a database client may take to send its startup (and a database its greeting) before the agent closes. */
export const DATABASE_STARTUP_TIMEOUT_MS = 20_000;
/** A probe's connect to the resource: below the Proxy's probe deadline, so that a dead resource is named as the failed hop. */
export const PROBE_RESOURCE_TIMEOUT_MS = 5_000;

/**
 * Connects to the resource a dial request names; rejects with a GatewayError that says why. A dial through the
 * Dialer records its plan on the hop's span (src/trace.ts) when one is given.
 */
export type ResourceDialer = (request: DialRequest, hop?: Pick<HopSpan, 'set'>) => Promise<Duplex>;

/**
 * Opens the upgrade rung's stream: an HTTP/1.1 upgrade on the Proxy's web address (through whatever proxy the
 * Dialer picks, an inspecting one included), onto which the tunnel's own mutual TLS then runs.
 */
export type UpgradeOpener = (dialer: Dialer, webAddr: string) => Promise<Duplex>;

export interface TunnelAgentOptions {
  identity: HostIdentity;
  dialer: Dialer;
  services: ServiceKind[];
  resources: AgentResources;
  connectResource: ResourceDialer;
  /** A probe's check of a resource (connect and close, src/agent/resources.ts resourceReach); without it probes dial as for a user. */
  reachResource?: (service: ServiceKind, name: string, timeoutMs: number) => Promise<number>;
  /** The SSH Service: gets the channel of each forwarded SSH connection (after the dial answer). */
  serveSsh?: (channel: Duplex, request: DialRequest) => void;
  /** Used until the Proxy's welcome says otherwise. */
  heartbeatIntervalMs?: number;
  heartbeatCountMax?: number;
  /** Overrides TUNNEL_RETRY (tests shorten it). */
  backoff?: Partial<BackoffPolicy>;
  /** The retry's clock, timers and randomness (tests drive them). */
  backoffDeps?: BackoffDeps;
  /** The Proxies (host IDs) the agent already holds a tunnel to through others: sent in the hello. */
  holds?: () => string[];
  /** Waited for before every dial (the pool's dial rate). */
  gate?: () => Promise<void>;
  /** The tunnel protocols offered over TLS, preferred first (default v2, v1; tests play an older agent with v1). */
  tunnelProtocols?: ReadonlyArray<'v1' | 'v2'>;
  /** v2 streams' initial credit, both ways (src/tunnel/session.ts). */
  streamWindow?: number;
  /** What the hello says of the agent's software: its version and upgrade channel (default: upgradeSoftware()). */
  software?: () => { version: string; channel: string };
  /** The agent's rollout group, sent in every hello (src/agent/rollout.ts agentUpgradeGroup). */
  upgradeGroup?: string;
  /** The agent's last measured health (src/agent/rollout.ts HealthReporter), sent after every welcome. */
  health?: () => AgentHealth | undefined;
  /** What the agent remembers of its transport ladder (the pool shares one); default: its own. */
  ladder?: Ladder;
  /** Only these rungs (a probe of the better ones); default every rung the Proxy offers. */
  rungs?: ReadonlyArray<RungName>;
  /** One attempt, no retry, drain_previous in the hello: a probe of a better rung (the pool's). */
  probe?: boolean;
  /** The upgrade rung's opener; without it the ladder has no upgrade rung. */
  openUpgrade?: UpgradeOpener;
  /** A /webapi/find answer already had (a probe gets its tunnel's, so it does not ask the web address again). */
  find?: FindResponse;
  /** The TLS handshake's deadline on the TLS rungs (default src/stream/tls.ts's, 30 s). */
  handshakeTimeoutMs?: number;
  /**
   * A new process's first tunnels (src/handover.ts): until the first welcome, the hello says drain_previous with
   * drain_ms, so that the tunnel of the process before (a hand-over, a pod replaced) drains for that long on the
   * Proxy instead of being cut with its sessions.
   */
  takeOver?: { drainMs: number };
  /**
   * End-to-end streams (src/agent/e2edata.ts, e2estream.ts): `pool` idle data connections per v2 tunnel on the alpn
   * rung (0 or absent: off, and the hello says nothing of it); `streams`, the agent's one E2EStreams that its pool's
   * tunnels share (default: one of this tunnel's own); `pools`, the agent's one DataPools, which dials per address
   * for every tunnel through it (default: one of this tunnel's own); `data`, the pools' deadlines and backoff
   * (tests shorten them).
   */
  e2e?: { pool: number; streams?: E2EStreams; pools?: DataPools; data?: DataPoolOptions; handshakeTimeoutMs?: number };
}

/**
 * This agent's version, and the upgrade channel its upgrader follows: the channel the endpoint file names
 * (/etc/gateway-upgrade.d/endpoint under GATEWAY_UPGRADE_ROOT, src/upgrade/settings.ts), "default" without a
 * readable one. Read at every hello, so a changed endpoint shows at the next reconnect.
 */
export function upgradeSoftware(env: NodeJS.ProcessEnv = process.env): { version: string; channel: string } {
  let channel = 'default';
  try {
    const file = resolveSettings(env).endpointFile;
    channel = parseEndpoint(readFileSync(file, 'utf8'), file).channel;
  } catch {
    // No endpoint (the upgrader is not enrolled), or not one it could use: the channel it would fall back to.
  }
  return { version: VERSION, channel };
}

function softwareFields(s: { version: string; channel: string }): { software_version: string; upgrade_channel: string } {
  return { software_version: s.version, upgrade_channel: s.channel };
}

/** Where a tunnel's data connections go, and how each is opened (dataPathOf). */
interface DataPath {
  addr: string;
  dialer: DataDialer;
}

/** The tunnel that is up, as the control protocol drives it (SSH or v2). */
interface ControlSide {
  control: Duplex;
  /** Drop the transport (a dead path sends no FIN); the retry follows the close. */
  drop(): void;
  /** The Proxy asked for a reconnect: close and retry at once. */
  reconnect(reason: string): void;
  /** The Proxy refused this agent (v2). */
  refused(): void;
  /**
   * The Proxy's host ID as this side verified it: the proxy-role certificate of the TLS connection, or on raw SSH
   * the Proxy whose tunnel host key /webapi/find (itself from a verified Proxy) lists for the key presented.
   * Undefined only on raw SSH to a Proxy of an earlier version, which lists keys without IDs.
   */
  proxyId(): string | undefined;
  /** Settled by the welcome: streams are served only once it came and named the verified Proxy. */
  welcomed: Gate;
  /** A v2 tunnel on the alpn rung: its TLS socket and the address it dialled (where its data connections go). */
  e2e?: { socket: TLSSocket } & DataPath;
  /** Once welcomed, with e2e: what an e2e-open on this tunnel uses (startDataPool). */
  e2eTunnel?: E2ETunnel;
}

/** A promise settled once from outside: streams wait on it before they are served. */
interface Gate {
  promise: Promise<boolean>;
  open(): void;
  shut(): void;
}

function gate(): Gate {
  let settle!: (ok: boolean) => void;
  const promise = new Promise<boolean>((resolve) => (settle = resolve));
  return { promise, open: () => settle(true), shut: () => settle(false) };
}

export type TunnelState = 'connecting' | 'connected' | 'waiting' | 'stopped';

export class TunnelAgent extends EventEmitter {
  private readonly log = logger('tunnel-agent');
  private client: ssh2.Client | undefined;
  private session: TunnelSession | undefined;
  private state: TunnelState = 'waiting';
  private stopped = false;
  private readonly retry: Backoff;
  private heartbeat: Heartbeat | undefined;
  /** Ends this tunnel's count in gateway_agent_tunnels_up (set while it is connected). */
  private tunnelUp: (() => void) | undefined;
  private readonly channels = new Set<Duplex>();
  private heartbeatIntervalMs: number;
  private heartbeatCountMax: number;
  /** The Proxy the tunnel is up to (its welcome), while it is. */
  private heldProxy: string | undefined;
  /** The last answer of /webapi/find, until an attempt fails before SSH is up. */
  private found: FindResponse | undefined;
  /** The last answer of /webapi/find, kept for when the web address cannot be reached (findOrLast). */
  private lastFind: FindResponse | undefined;
  /** Closes the connection of the attempt in progress or up (then a retry follows, unless stopped). */
  private closeCurrent: ((reason?: string) => void) | undefined;
  readonly ladder: Ladder;
  /** The rung of the tunnel up or being brought up. */
  private rungInUse: RungName | undefined;
  /** A probe not yet promoted: tries once, and its hello asks the Proxy to drain the tunnel it replaces. */
  private probing: boolean;
  /** The rungs a probe is limited to (until promoted). */
  private onlyRungs: ReadonlyArray<RungName> | undefined;
  /** Set while draining: called whenever a stream of this tunnel closes. */
  private onChannelGone: (() => void) | undefined;
  /** Until the first welcome: the hello drains the tunnel of the process before (options.takeOver). */
  private takingOver: { drainMs: number } | undefined;
  /** Held (a hand-over in progress): the tunnel serves, but once closed it is not dialled again until released. */
  private held = false;
  /** A close that was not followed by a dial because the tunnel was held. */
  private heldDown = false;
  /** Draining for a hand-over or a stop: dial requests are refused with GW_ERR_AGENT_DRAINING. */
  private refusing = false;

  constructor(private readonly options: TunnelAgentOptions) {
    super();
    this.heartbeatIntervalMs = options.heartbeatIntervalMs ?? 15_000;
    this.heartbeatCountMax = options.heartbeatCountMax ?? 3;
    this.retry = new Backoff({ ...TUNNEL_RETRY, ...options.backoff }, options.backoffDeps);
    this.ladder = options.ladder ?? new Ladder();
    this.probing = options.probe === true;
    this.onlyRungs = options.rungs;
    this.lastFind = options.find;
    if (this.probing) this.found = options.find;
    this.takingOver = options.takeOver;
    this.e2eStreams =
      options.e2e?.streams ??
      new E2EStreams({
        identity: options.identity,
        services: options.services,
        resources: options.resources,
        ssh: options.serveSsh !== undefined,
        log: this.log,
        ...(options.e2e?.handshakeTimeoutMs ? { handshakeTimeoutMs: options.e2e.handshakeTimeoutMs } : {}),
      });
    this.dataPools = options.e2e?.pools ?? new DataPools();
  }

  /**
   * A hand-over started (src/handover.ts): the tunnel keeps serving, but a close is not followed by a dial (the
   * successor's tunnels take this one's place; a redial would cut them). hold(false): the successor failed, the
   * tunnel dials again if it is down.
   */
  hold(on: boolean): void {
    this.held = on;
    if (!on && this.heldDown) {
      this.heldDown = false;
      this.scheduleRetry(true);
    }
  }

  /** The last /webapi/find answer this tunnel used (a probe starts from its tunnel's). */
  get findAnswer(): FindResponse | undefined {
    return this.lastFind;
  }

  /** The rung the tunnel is up on (or being brought up on). */
  get rung(): RungName | undefined {
    return this.rungInUse;
  }

  /**
   * The rungs better than the one this tunnel is up on, from the last /webapi/find answer: what the pool probes.
   * Empty while down, and on the best rung.
   */
  betterRungs(): Rung[] {
    const find = this.found ?? this.lastFind;
    if (this.state !== 'connected' || !find || !this.rungInUse) return [];
    const rungs = this.offered(find);
    const at = rungs.findIndex((r) => r.name === this.rungInUse);
    return at > 0 ? rungs.slice(0, at) : [];
  }

  /** A probe that was welcomed becomes an ordinary tunnel: every rung, retries, no drain_previous. */
  promote(): void {
    this.probing = false;
    this.onlyRungs = undefined;
  }

  /**
   * Drains this tunnel (another replaced it): no retry and no new attempt; it closes once the streams in flight
   * have closed, or after capMs with whatever is left. Resolves when it is closed.
   */
  drain(capMs: number, options: { refuseNew?: boolean; why?: string } = {}): Promise<void> {
    this.stopped = true;
    this.retry.stop();
    if (options.refuseNew) this.refusing = true;
    this.log.info({ proxyId: this.heldProxy, rung: this.rungInUse, streams: this.channels.size, capMs }, options.why ?? 'draining the replaced tunnel');
    return new Promise((resolve) => {
      const finish = () => {
        clearTimeout(cap);
        this.onChannelGone = undefined;
        this.stop();
        resolve();
      };
      const cap = setTimeout(() => {
        if (this.channels.size > 0) this.log.warn({ streams: this.channels.size, capMs, code: 'GW_ERR_DRAIN_LIMIT' }, `drain limit (${capMs} ms) reached; closing the tunnel with the ${this.channels.size} session(s) still in it`);
        finish();
      }, capMs);
      cap.unref();
      this.onChannelGone = () => {
        if (this.channels.size === 0) finish();
      };
      if (this.channels.size === 0 || this.state !== 'connected') finish();
    });
  }

  getState(): TunnelState {
    return this.state;
  }

  /** The streams (sessions) in flight on this tunnel. */
  get streams(): number {
    return this.channels.size;
  }

  /** The host ID of the Proxy this tunnel is up to (from its welcome), or undefined while it is not up. */
  get proxyId(): string | undefined {
    return this.heldProxy;
  }

  /**
   * Closes the tunnel (or the attempt in progress) and connects again after the backoff: for a Proxy that left
   * the cluster, or a tunnel a newer one to the same Proxy replaced.
   */
  drop(reason: string): void {
    if (this.stopped) return;
    this.log.info({ proxyId: this.heldProxy, reason }, 'dropping the reverse tunnel');
    this.heldProxy = undefined;
    this.closeCurrent?.();
  }

  /** The events queued while down, handed over (to another tunnel) and forgotten here. */
  takePending(): Array<Record<string, unknown>> {
    return this.pendingEvents.splice(0);
  }

  start(): void {
    this.stopped = false;
    this.retry.resume();
    void this.connect();
  }

  private setState(state: TunnelState): void {
    if (this.state === state) return;
    this.state = state;
    this.tunnelUp?.();
    this.tunnelUp = state === 'connected' ? recordAgentTunnelUp(this.rungInUse) : undefined;
    this.emit('state', state);
  }

  private scheduleRetry(immediate = false): void {
    if (this.stopped) return;
    if (this.held) {
      this.heldDown = true;
      this.setState('waiting');
      this.log.info('reverse tunnel down during a hand-over; not dialling again (the successor holds this Proxy)');
      return;
    }
    if (this.probing) {
      // A probe tries once: the pool decides when to probe again (LADDER_PROBE).
      this.stop();
      this.emit('probe-failed', this.lastFailure ?? new GatewayError('GW_ERR_TUNNEL_RUNG', 'the probe\'s tunnel closed before the Proxy welcomed it'));
      return;
    }
    const delay = immediate ? 0 : this.retry.next();
    recordAgentReconnect(this.rungInUse);
    this.setState('waiting');
    this.log.info({ retryInMs: delay }, 'reverse tunnel down; reconnecting');
    this.retry.schedule(() => void this.connect(), delay);
  }

  private async find(): Promise<FindResponse> {
    const { identity } = this.options;
    const api = new ApiClient({ address: identity.server, dialer: this.options.dialer, ca: identity.hostCa, cert: identity.cert, key: identity.key, timeoutMs: 15_000 });
    const find = await api.call<FindResponse>('GET', FIND_PATH);
    this.lastFind = find;
    return find;
  }

  /**
   * /webapi/find, or when the web address cannot be reached from here (a path failure: the very case of a lower
   * rung) the last answer a verified Proxy gave: the tunnel port it names still has to show a host key that answer
   * lists, so an old answer opens nothing the cluster did not vouch for.
   */
  private async findOrLast(): Promise<FindResponse> {
    try {
      return await this.find();
    } catch (err) {
      const e = toGatewayError(err);
      if (!this.lastFind || !fallsThrough(e)) throw e;
      this.log.info({ code: e.code, err: e.message }, 'cannot ask the Proxy for its transports; using its last answer');
      return this.lastFind;
    }
  }

  /** The rungs this agent may use for a find answer, best first (a probe: only those it was given). */
  private offered(find: FindResponse): Rung[] {
    const all = rungsOf(find, this.options.identity.server, { upgrade: this.options.openUpgrade !== undefined });
    const only = this.onlyRungs;
    return only ? all.filter((r) => only.includes(r.name)) : all;
  }

  /**
   * The transport to the Proxy down the ladder (src/agent/ladder.ts): from the rung that last worked (a probe:
   * from its best), on to the next rung after a failure that means the path does not work from here, logged with
   * its reason; any other failure ends the attempt.
   */
  private async openTransport(find: FindResponse): Promise<{ transport: Duplex; v2: boolean; overTls: boolean; proxyId?: string; rung: RungName; addr: string }> {
    const rungs = this.offered(find);
    if (rungs.length === 0) throw new GatewayError('GW_ERR_TUNNEL_DOWN', 'the Proxy advertises no reverse-tunnel transport this agent can use');
    for (let i = this.probing ? 0 : this.ladder.startAt(rungs); ; i++) {
      const rung = rungs[i]!;
      this.rungInUse = rung.name;
      try {
        return { ...(await this.openRung(rung)), rung: rung.name, addr: rung.addr };
      } catch (err) {
        const e = toGatewayError(err);
        const next = rungs[i + 1];
        if (!fallsThrough(e)) throw e;
        if (!next) {
          this.ladder.forget(); // every rung failed: the next attempt starts at the best again
          throw e;
        }
        this.log.warn({ rung: rung.name, next: next.name, code: e.code, reason: fallReason(rung, e, next) }, 'transport ladder: falling to the next rung');
        this.emit('fall', rung.name, next.name, e);
      }
    }
  }

  /**
   * One rung's transport: raw SSH on the tunnel port, or TLS (on a socket, or inside the upgrade) whose ALPN says
   * v2 or SSH, and over TLS the Proxy's host ID from its certificate, which must carry the role proxy
   * (src/client/api.ts memberIdentity): any host certificate of the cluster chains to the host CA, an agent's too.
   */
  private async openRung(rung: Rung): Promise<{ transport: Duplex; v2: boolean; overTls: boolean; proxyId?: string }> {
    const { identity, dialer } = this.options;
    if (rung.name === 'tunnel-port') return { transport: await dialer.dial(rung.addr), v2: false, overTls: false };
    const addr = rung.addr;
    const offered: string[] = (this.options.tunnelProtocols ?? ['v2', 'v1']).map((v) => (v === 'v2' ? TUNNEL_ALPN_V2 : TUNNEL_ALPN_V1));
    const raw = rung.name === 'upgrade' ? await this.options.openUpgrade!(dialer, addr) : await dialer.dial(addr);
    const tlsOptions = { ALPNProtocols: offered, ca: identity.hostCa, cert: identity.cert, key: identity.key, host: parseAddr(addr).host, checkServerIdentity: proxyServerIdentity };
    const socket = await connectTls(raw, { ...tlsOptions, ...(this.options.handshakeTimeoutMs ? { handshakeTimeoutMs: this.options.handshakeTimeoutMs } : {}) }).catch((err: Error) => {
      throw (
        tlsVerifyError(err, { address: addr, server: 'proxy', untrustedHint: UNTRUSTED_HINTS.clusterCa(addr) }) ??
        (err instanceof GatewayError ? err : new GatewayError(pathBroke(err) ? 'GW_ERR_TUNNEL_RUNG' : 'GW_ERR_TUNNEL_AUTH', `TLS with the Proxy at ${addr} failed: ${err.message}`, { cause: err }))
      );
    });
    if (!socket.alpnProtocol || !offered.includes(socket.alpnProtocol)) {
      socket.destroy();
      // Something in the path answered TLS with the cluster's certificate yet not the tunnel's ALPN: the next rung may do.
      throw new GatewayError('GW_ERR_TUNNEL_RUNG', `the Proxy at ${addr} did not accept ALPN ${offered.join(' or ')}`);
    }
    const proxy = memberIdentity(addr, socket.getPeerCertificate().raw, 'proxy');
    if (proxy instanceof GatewayError) {
      socket.destroy(); // checked in the handshake already; a certificate read back differently is not used either
      throw proxy;
    }
    return { transport: socket, v2: socket.alpnProtocol === TUNNEL_ALPN_V2, overTls: true, proxyId: proxy.name };
  }

  private async connect(): Promise<void> {
    if (this.stopped) return;
    await this.options.gate?.();
    if (this.stopped) return;
    this.setState('connecting');
    let transport: Duplex;
    let v2: boolean;
    let overTls: boolean;
    let proxyId: string | undefined;
    let find: FindResponse;
    let rung: RungName;
    let addr: string;
    let aborted = false;
    this.closeCurrent = () => (aborted = true);
    try {
      // Asked once and kept while tunnels come up: behind a load balancer every dial counts (and a round robin
      // that alternated find and tunnel connections would send the tunnels to every other Proxy only).
      find = this.found ?? (await this.findOrLast());
      this.found = find;
      ({ transport, v2, overTls, proxyId, rung, addr } = await this.openTransport(find));
      if (!v2) sshModule ??= (await import('ssh2')).default;
    } catch (err) {
      this.found = undefined;
      const e = toGatewayError(err);
      this.lastFailure = e;
      this.log.warn({ code: e.code, err: e.message, ...(e.hint ? { hint: e.hint } : {}) }, 'cannot reach the Proxy');
      this.emit('failure', e);
      this.scheduleRetry();
      return;
    }
    if (aborted || this.stopped) {
      transport.destroy();
      if (!this.stopped) this.scheduleRetry();
      return;
    }
    if (v2) this.openSession(find, transport, proxyId, this.dataPathOf(rung, addr));
    else this.openSsh(find, transport, proxyId, overTls);
  }

  /**
   * How end-to-end streams' data connections reach the Proxy: the way the tunnel's rung does. On the alpn rung each
   * is dialled as the tunnel was; on the upgrade rung (a proxy that inspects TLS: a data connection's own first bytes
   * would not pass it) each rides a connection upgrade of its own, as the tunnel does, and the one port routes it by
   * its first bytes inside. Its key is still the tunnel's: the tunnel's mutual TLS runs inside the upgrade, with the
   * Proxy. The pool's address names the way, so that tunnels of the two rungs never share a pool.
   */
  private dataPathOf(rung: RungName, addr: string): DataPath | undefined {
    const { dialer, openUpgrade } = this.options;
    if (rung === 'alpn') return { addr, dialer };
    if (rung === 'upgrade' && openUpgrade) return { addr: `${addr} (connection upgrade)`, dialer: { dial: () => openUpgrade(dialer, addr) } };
    return undefined;
  }

  /** v2: a TunnelSession on the TLS connection; the Proxy's streams are served as SSH channels are. */
  private openSession(find: FindResponse, socket: Duplex, proxyId: string | undefined, data: DataPath | undefined): void {
    let closed = false;
    const welcomed = gate();
    const onClosed = (reason: string) => {
      if (closed) return;
      closed = true;
      welcomed.shut();
      socket.destroy();
      const current = this.session === session;
      if (current) this.session = undefined;
      if (reason === 'refused') this.found = undefined; // as when SSH refuses: ask again where the tunnel is, and how
      else if (reason !== 'duplicate' && reason !== 'reconnect notice') this.log.warn({ reason }, 'reverse tunnel closed');
      this.tunnelClosed(reason, current);
    };
    const session = new TunnelSession(socket, {
      role: 'agent',
      ...(this.options.streamWindow ? { window: this.options.streamWindow } : {}),
      onStream: (stream: TunnelStream) => {
        this.trackChannel(stream);
        // An end-to-end stream on it is served with this session's own e2e side (set once it was welcomed).
        void this.serveChannel(stream, welcomed.promise, () => side.e2eTunnel);
      },
      onClose: (err) => {
        if (err) {
          this.log.warn({ code: err.code, err: err.message }, 'the Proxy broke the tunnel protocol; reconnecting');
          this.emit('failure', err);
        }
        onClosed(err ? err.message : 'connection closed');
      },
    });
    this.session = session;
    this.closeCurrent = (reason = 'dropped by the agent') => onClosed(reason);
    const side: ControlSide = {
      control: session.control,
      drop: () => session.destroy(),
      reconnect: (reason) => {
        this.log.info({ reason }, 'the Proxy asked agents to reconnect');
        onClosed('reconnect notice');
      },
      refused: () => {
        const e = refusedError(this.options.identity, find);
        this.log.warn({ code: e.code, err: e.message, hint: e.hint }, 'the Proxy refused this agent');
        this.emit('failure', e);
        onClosed('refused');
      },
      proxyId: () => proxyId,
      welcomed,
      ...(data !== undefined && this.e2ePool > 0 ? { e2e: { socket: socket as TLSSocket, ...data } } : {}),
    };
    this.runControl(side);
  }

  /** SSH over the transport, then the forward and the control channel; a retry is scheduled when it closes. */
  private openSsh(find: FindResponse, transport: Duplex, tlsProxyId: string | undefined, overTls: boolean): void {
    const { identity } = this.options;
    const client = new sshModule!.Client();
    this.client = client;
    let connectedOnce = false;
    let closed = false;
    // Over TLS, the Proxy's certificate named it; on raw SSH, the host key it presents does (hostVerifier).
    let proxyId = tlsProxyId;
    const welcomed = gate();
    const onClosed = (reason: string) => {
      if (closed) return;
      closed = true;
      welcomed.shut();
      transport.destroy(); // a half-closed transport would otherwise stay open for ever
      const current = this.client === client;
      if (current) this.client = undefined;
      if (!connectedOnce) this.found = undefined; // no SSH session: ask again where the tunnel is, and how
      else if (reason !== 'duplicate') this.log.warn({ reason }, 'reverse tunnel closed');
      this.tunnelClosed(reason, current);
    };
    this.closeCurrent = (reason = 'dropped by the agent') => {
      transport.destroy();
      client.end();
      onClosed(reason);
    };
    client.on('error', (err) => {
      const hostKey = /host key/i.test(err.message);
      const refused = (err as Error & { level?: string }).level === 'client-authentication';
      const e = refused
        ? refusedError(identity, find)
        : new GatewayError(hostKey ? 'GW_ERR_TUNNEL_AUTH' : 'GW_ERR_TUNNEL_DOWN', `reverse tunnel: ${err.message}`);
      this.log.warn({ code: e.code, err: e.message, ...(refused ? { hint: e.hint } : {}) }, refused ? 'the Proxy refused this agent' : 'reverse tunnel error');
      this.emit('failure', e);
      onClosed(err.message);
    });
    client.on('close', () => onClosed('connection closed'));
    // The transport allows half-close (the Dialer's sockets do), so the far end closing shows up as 'end' only:
    // ssh2 then stops using the connection (and its keepalives) without ever emitting 'close'. A CONNECT proxy
    // that restarts, or closes the tunnel because the Proxy dropped it, ends the connection this way.
    client.on('end', () => onClosed('connection ended by the other side'));
    client.on('tcp connection', (info, accept, reject) => {
      if (info.destIP !== TUNNEL_BIND.addr) return reject();
      const channel = relayChannel(accept());
      this.channels.add(channel);
      channel.once('close', () => {
        this.channels.delete(channel);
        this.onChannelGone?.();
      });
      void this.serveChannel(channel, welcomed.promise);
    });
    client.on('ready', () => {
      connectedOnce = true;
      client.forwardIn(TUNNEL_BIND.addr, TUNNEL_BIND.port, (err) => {
        if (err) {
          this.log.error({ err: err.message }, 'the Proxy refused the tunnel forward');
          client.end();
          return;
        }
        client.subsys(CONTROL_SUBSYSTEM, (subErr, control) => {
          if (subErr) {
            this.log.error({ err: subErr.message }, 'the Proxy refused the control channel');
            client.end();
            return;
          }
          this.runControl({ ...this.sshSide(client, control, transport), proxyId: () => proxyId, welcomed });
        });
      });
    });
    const allowedKeys = (find.tunnel_host_keys ?? []).map((k) => sshModule!.utils.parseKey(k)).filter((k): k is ssh2.ParsedKey => !(k instanceof Error) && !Array.isArray(k));
    client.connect({
      sock: transport,
      username: identity.hostId,
      privateKey: sshPrivateKeyPem(identity.key),
      readyTimeout: 20_000,
      keepaliveInterval: this.heartbeatIntervalMs,
      keepaliveCountMax: this.heartbeatCountMax,
      hostVerifier: (key: Buffer) => {
        // Over TLS (the alpn and upgrade rungs) the Proxy is already authenticated by its cluster certificate; on
        // raw SSH (the tunnel-port rung, whatever tls_routing_enabled says) its key must be listed.
        if (overTls) return true;
        const ok = allowedKeys.some((k) => k.getPublicSSH().equals(key));
        if (!ok) this.log.error('the Proxy presented an SSH host key that the cluster does not list; refusing it');
        else proxyId = proxyOfHostKey(find, key);
        return ok;
      },
    });
  }

  /** The SSH connection as the control protocol drives it (the Proxy's identity is openSsh's). */
  private sshSide(client: ssh2.Client, control: Duplex, transport: Duplex): Omit<ControlSide, 'proxyId' | 'welcomed'> {
    return {
      control,
      // Drop the transport we handed ssh2, not only the SSH connection: a dead path delivers no FIN, and ending
      // SSH alone would wait on it. The retry starts when ssh2 reports the close.
      drop: () => {
        transport.destroy();
        client.end();
      },
      reconnect: (reason) => {
        this.log.info({ reason }, 'the Proxy asked agents to reconnect');
        client.removeAllListeners('close');
        client.removeAllListeners('end'); // this path schedules the retry itself
        client.once('close', () => undefined);
        client.end();
        this.emitClosedForReconnect();
      },
      refused: () => undefined, // v2 only
    };
  }

  private control: Duplex | undefined;
  private readonly pendingEvents: Array<Record<string, unknown>> = [];
  /** The failure of the last attempt (what a probe that failed reports). */
  private lastFailure: GatewayError | undefined;
  private readonly renewals = new PendingRenewals();
  /** End-to-end streams: the checks, used grants and locks (shared by a pool's tunnels when options.e2e.streams). */
  private readonly e2eStreams: E2EStreams;
  /** The data connections of the tunnel up, when it takes end-to-end streams (its share of its address's pool). */
  private dataPool: DataTunnelHandle | undefined;
  /** options.e2e.pools, or this tunnel's own. */
  private readonly dataPools: DataPools;

  /** The data connections each tunnel keeps: options.e2e.pool, within what a Proxy keeps (DATA_POOL_MAX). */
  private get e2ePool(): number {
    return Math.max(0, Math.min(this.options.e2e?.pool ?? 0, DATA_POOL_MAX));
  }

  /** The numbers of the idle data connections waiting at the Proxy of the tunnel up (none: no end-to-end streams on it). */
  get dataConnections(): number[] {
    return this.dataPool?.numbers ?? [];
  }

  /**
   * After a welcome on a tunnel that offered end-to-end streams (side.e2e): the tunnel joins the data connections'
   * pool of the address it dialled (its key from its TLS session, dataKeyOf; its Proxy's host ID), leaves it when
   * its control stream closes; and what an e2e-open on it uses. A failure here costs end-to-end streams only, never
   * the tunnel.
   */
  private startDataPool(side: ControlSide): void {
    const e2e = side.e2e;
    const proxyId = side.proxyId();
    const cert = e2e ? peerX509(e2e.socket) : undefined;
    if (!e2e || !proxyId || !cert || side.e2eTunnel) return;
    let key: Buffer;
    try {
      key = dataKeyOf(e2e.socket);
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, 'cannot derive the data connections\' key; no end-to-end streams on this tunnel');
      return;
    }
    const pool = this.dataPools.attach({ dialer: e2e.dialer, addr: e2e.addr, proxyId, key, size: this.e2ePool, log: this.log, ...this.options.e2e!.data });
    this.dataPool = pool;
    side.e2eTunnel = {
      proxyId,
      proxyCert: cert,
      take: (n) => pool.take(n),
      track: (stream) => this.trackChannel(stream),
      serve: (channel, request, onOpen) => void this.serveDial(channel, request, onOpen),
      sendEvent: (event) => this.sendEvent(event),
    };
    // Grants this Proxy issued are checked with its certificate, whichever tunnel of this agent routes them.
    const unregister = this.e2eStreams.registerProxy(proxyId, cert);
    side.control.once('close', () => {
      unregister();
      pool.detach();
      if (this.dataPool === pool) this.dataPool = undefined;
    });
  }

  /** A stream of this tunnel (a forwarded one, or an end-to-end one): its close, and the drain that waits for it. */
  private trackChannel(stream: Duplex): void {
    if (this.channels.has(stream)) return;
    this.channels.add(stream);
    stream.once('close', () => {
      this.channels.delete(stream);
      this.onChannelGone?.();
    });
  }

  /** Tells the Proxy of this tunnel, if it is up, the agent's renewed SSH host certificate (the next hello carries it too). */
  announceHostCert(sshCert: string): void {
    if (this.control && this.state === 'connected') writeJsonLine(this.control, { type: 'host-cert', ssh_cert: sshCert } satisfies ControlMessage);
  }

  /** Asks the Proxy of this tunnel for fresh host certificates for the key (src/agent/renewal.ts). */
  requestRenewal(publicKeyPem: string): Promise<RenewedCerts> {
    const control = this.control;
    if (!control || this.state !== 'connected') return Promise.reject(new GatewayError('GW_ERR_TUNNEL_DOWN', 'no reverse tunnel is connected to ask for a renewal'));
    const { identity } = this.options;
    const proof = signRenewProof(identity.key, identity.hostId, identity.cluster, publicKeyPem, Date.now());
    return this.renewals.ask((id) => writeJsonLine(control, { type: 'renew', id, public_key: publicKeyPem, proof } satisfies ControlMessage));
  }

  /** Sends an audit event to the Proxy (queued, at most 1 000, while the tunnel is down). */
  /** The agent's health changed: its Proxy hears it (not queued: the welcome sends the newest). */
  sendHealth(health: AgentHealth): void {
    if (this.control && this.state === 'connected') writeJsonLine(this.control, { type: 'health', health } satisfies ControlMessage);
  }

  sendEvent(event: Record<string, unknown>): void {
    if (this.control && this.state === 'connected') {
      writeJsonLine(this.control, { type: 'event', event } satisfies ControlMessage);
      return;
    }
    this.pendingEvents.push(event);
    if (this.pendingEvents.length > 1000) this.pendingEvents.shift();
  }

  /**
   * How long the Proxy may be silent: countMax of its heartbeats missed in a row, as the Proxy allows the agent,
   * so both ends find a dead path within the same deadTunnelBoundMs (src/tunnel/control.ts).
   */
  private silentAfterMs(): number {
    return this.heartbeatIntervalMs * this.heartbeatCountMax;
  }

  private runControl(side: ControlSide): void {
    const { identity } = this.options;
    const { control, drop } = side;
    this.control = control;
    control.once('close', () => {
      if (this.control === control) this.control = undefined;
      this.renewals.failAll('control channel closed');
    });
    const send = (m: ControlMessage) => writeJsonLine(control, m);
    send({
      type: 'hello',
      version: PROTOCOL_VERSION,
      hostId: identity.hostId,
      nodename: identity.nodename,
      services: this.options.services,
      resources: this.options.resources,
      ...(this.options.holds ? { holds: this.options.holds() } : {}),
      ...(this.probing ? { drain_previous: true } : {}),
      ...(this.takingOver ? { drain_previous: true, drain_ms: this.takingOver.drainMs } : {}),
      ...softwareFields((this.options.software ?? upgradeSoftware)()),
      ...(this.options.upgradeGroup === undefined ? {} : { upgrade_group: this.options.upgradeGroup }),
      // kube: this agent impersonates on end-to-end kube streams (src/agent/kubeapi.ts), so it may be given kube grants.
      ...(side.e2e ? { e2e: { v: 1, pool: this.e2ePool, kube: true, peered: true, stream: true } } : {}),
      signs_presence: true,
    });
    // The Proxy heartbeats too: when it has been silent for the whole window the path is dead (a cut link,
    // a balancer that dropped the flow without a reset). Anything it sends counts as a sign of life.
    const heartbeat = new Heartbeat({
      send: (seq) => send({ type: 'heartbeat', seq }),
      onSilent: (silentMs) => {
        this.log.warn({ silentMs }, 'the Proxy missed its heartbeats; reconnecting');
        recordAgentMissedHeartbeats(this.rungInUse);
        drop();
      },
    });
    this.heartbeat = heartbeat;
    heartbeat.start(this.heartbeatIntervalMs, this.silentAfterMs());
    control.on('data', () => heartbeat.heard());
    readControl(
      control,
      (m) => this.onControlMessage(m, side, heartbeat, send),
      (err) => {
        this.log.warn({ code: err.code, err: err.message }, 'the Proxy broke the control protocol; reconnecting');
        drop();
      },
    );
  }

  /**
   * Signs this agent's presence through the Proxy its welcome names (host ID, cluster, that Proxy, what the hello
   * announced, the time) now and every PRESENCE_PROOF_EVERY_MS while this control channel is open: a remote Auth
   * Service takes a presence from that Proxy only with a fresh one (src/auth/memberchecks.ts).
   */
  private provePresence(proxyId: string, side: ControlSide, send: (m: ControlMessage) => void): void {
    const { identity } = this.options;
    const prove = () => {
      try {
        const claim = { proxyId, services: this.options.services, resources: this.options.resources };
        send({ type: 'presence-proof', proxyId, ...signPresenceProof(identity.key, identity.hostId, identity.cluster, claim, Date.now()) });
      } catch (err) {
        this.log.warn({ err: (err as Error).message }, 'cannot sign the presence proof');
      }
    };
    prove();
    const timer = setInterval(prove, PRESENCE_PROOF_EVERY_MS);
    timer.unref();
    side.control.once('close', () => clearInterval(timer));
  }

  private onControlMessage(m: ControlMessage, side: ControlSide, heartbeat: Heartbeat, send: (m: ControlMessage) => void): void {
    switch (m.type) {
      case 'welcome': {
        const verified = side.proxyId();
        if (verified !== undefined && m.proxyId !== verified) {
          this.refuseWelcome(m.proxyId, verified, side);
          return;
        }
        this.retry.up();
        if (this.rungInUse) this.ladder.up(this.rungInUse);
        this.heartbeatIntervalMs = m.heartbeatIntervalMs;
        this.heartbeatCountMax = m.heartbeatCountMax;
        heartbeat.start(this.heartbeatIntervalMs, this.silentAfterMs());
        this.heldProxy = verified ?? m.proxyId;
        this.takingOver = undefined; // the process before's tunnel here drains; later hellos are ordinary
        side.welcomed.open();
        this.setState('connected');
        // Before the queued events: the Proxy relays them once the presence this proof backs is written.
        this.provePresence(this.heldProxy, side, send);
        this.startDataPool(side);
        for (const event of this.pendingEvents.splice(0)) send({ type: 'event', event });
        // The Proxy keeps the health of this tunnel only: a new one hears the last measure at once.
        const health = this.options.health?.();
        if (health) send({ type: 'health', health });
        this.log.info({ proxyId: this.heldProxy, rung: this.rungInUse, heartbeatMs: m.heartbeatIntervalMs }, 'reverse tunnel ready');
        // Whatever changed while the tunnel was down: treat a new connection as a possible change.
        this.emit('maintenance-changed');
        this.emit('connected', this.heldProxy);
        return;
      }
      case 'reconnect':
        side.reconnect(m.reason);
        return;
      case 'refused':
        side.refused();
        return;
      case 'duplicate':
        // The Proxy already holds a tunnel of this agent (another of its pool's): this one closes, and the
        // pool's backoff decides when to dial the balancer again.
        this.log.debug({ proxyId: m.proxyId }, 'landed on a Proxy this agent already holds a tunnel to');
        this.emit('duplicate', m.proxyId);
        this.closeCurrent?.('duplicate');
        return;
      case 'discovery':
        this.emit('discovery', m.proxies, m.strategy);
        return;
      case 'maintenance-changed':
        this.emit('maintenance-changed');
        return;
      case 'renewal':
        this.renewals.answer(m);
        return;
      case 'e2e-open':
        if (side.e2eTunnel) this.e2eStreams.onOpen(m, side.e2eTunnel);
        else this.log.warn({ conn: m.conn }, 'an e2e-open on a tunnel that takes no end-to-end streams; ignored');
        return;
      case 'locks':
        this.e2eStreams.onLocks(m);
        return;
      default:
        return; // hello and event go the other way; the Proxy's heartbeats matter only as data (heard above)
    }
  }

  /**
   * A welcome naming another Proxy than the one this side verified (its certificate, or its listed host key): the
   * claim is not recorded, nothing is served through this tunnel, and it is dropped (the retry follows the backoff).
   */
  private refuseWelcome(claimed: string, verified: string, side: ControlSide): void {
    const e = new GatewayError('GW_ERR_TUNNEL_AUTH', `the Proxy ${verified} welcomed this agent as Proxy ${String(claimed).slice(0, 128)}: refused, the tunnel is dropped`, {
      hint: "A Proxy's welcome must name the Proxy its certificate names; a Proxy that claims another's ID is misconfigured or compromised: check it ('gwctl get proxies').",
      details: { verified, claimed: String(claimed).slice(0, 128) },
    });
    this.log.error({ code: e.code, err: e.message, proxyId: verified }, 'the Proxy claimed another Proxy ID; dropping the tunnel');
    this.emit('failure', e);
    side.welcomed.shut();
    side.drop();
  }

  private emitClosedForReconnect(): void {
    this.client = undefined;
    this.tunnelClosed('reconnect notice', true);
  }

  /**
   * A tunnel (v2 or SSH) is over: its heartbeat and channels go, the Proxy it reached is forgotten when it was the
   * tunnel in use (`current`), and a retry follows (at once after a reconnect notice).
   */
  private tunnelClosed(reason: string, current: boolean): void {
    this.heartbeat?.stop();
    if (current) this.dataPool?.detach();
    for (const ch of this.channels) ch.destroy();
    this.channels.clear();
    if (current) {
      this.heldProxy = undefined;
      this.closeCurrent = undefined;
    }
    this.emit('disconnected', reason);
    this.scheduleRetry(reason === 'reconnect notice');
  }

  /**
   * A stream the Proxy opened: served once the tunnel's welcome named the verified Proxy (welcomed), else closed. An
   * end-to-end stream on it (its first line an e2e-open) goes to its own tunnel's e2e side (e2eOf: v2 only).
   */
  private async serveChannel(channel: Duplex, welcomed: Promise<boolean>, e2eOf: () => E2ETunnel | undefined = () => undefined): Promise<void> {
    if (!(await welcomed)) {
      channel.destroy();
      return;
    }
    let request: DialRequest | E2EOpenMessage;
    try {
      request = await readJsonLine<DialRequest | E2EOpenMessage>(channel, { what: 'dial request', timeoutMs: 15_000 });
    } catch {
      channel.destroy();
      return;
    }
    if ((request as Partial<E2EOpenMessage>).type === 'e2e-open') return this.serveE2EStream(channel, request as E2EOpenMessage, e2eOf());
    request = request as DialRequest;
    if (request.probe === true && this.options.reachResource) return this.answerProbe(channel, request, this.options.reachResource);
    return this.serveDial(channel, request);
  }

  /**
   * An end-to-end stream on a stream of this tunnel (no data connection waited at the Proxy: src/tunnel/e2e.ts
   * E2E_CONN_TUNNEL): checked and served as one on a data connection, by the tunnel that takes end-to-end streams.
   */
  private serveE2EStream(channel: Duplex, m: E2EOpenMessage, e2eTunnel: E2ETunnel | undefined): void {
    if (!e2eTunnel) {
      this.log.warn('an end-to-end stream on a tunnel that takes none; closed');
      return void channel.destroy();
    }
    this.e2eStreams.onTunnelStream(m, e2eTunnel, channel);
  }

  /**
   * A dial request (a tunnel stream's first line, or the one an end-to-end grant implies: src/agent/e2estream.ts)
   * answered with its DialAnswer line and served. onOpen, once the session runs (a database's after its gate, with
   * the user and database it asked for; never for SSH, whose sessions the SSH Service reports).
   */
  private async serveDial(channel: Duplex, request: DialRequest, onOpen?: (fields: Record<string, unknown>) => void): Promise<void> {
    if (this.refusing) {
      // Draining (a stop, or a hand-over whose successor has not reached this Proxy): the sessions in flight go
      // on, a new one is refused with a code the client prints.
      const error = new GatewayError('GW_ERR_AGENT_DRAINING', 'this agent is stopping: it finishes the sessions in flight and takes no new one');
      writeJsonLine(channel, { ok: false, error: { code: error.code, message: error.message } } satisfies DialAnswer);
      channel.end();
      return;
    }
    // This hop's span (dialhop.ts): a child of the Proxy's.
    const hop = startAgentDial(request, this.options.identity.hostId);
    if (request.service === 'ssh' && this.options.serveSsh) {
      hop.end();
      channel = answerOk(channel, request);
      // SSH has no half-close: the user's connection ending its side ends the session (ssh2 would wait for ever
      // on a v2 stream, which keeps the other half open; a v1 channel closed whole).
      channel.once('end', () => {
        if (!channel.writableEnded) channel.end();
      });
      this.options.serveSsh(channel, request);
      return;
    }
    let target: Duplex;
    try {
      target = await this.options.connectResource(request, hop);
    } catch (err) {
      const e = toGatewayError(err);
      hop.fail(e.code);
      hop.end();
      this.log.warn({ service: request.service, resource: request.resource, code: e.code, err: e.message }, 'cannot reach the resource');
      const answer: DialAnswer = { ok: false, error: { code: e.code, message: e.message } };
      channel.end(`${JSON.stringify(answer)}\n`);
      return;
    }
    hop.end();
    channel = answerOk(channel, request);
    if (request.service !== 'db') {
      onOpen?.({});
      return splice(channel, target);
    }
    const protocol = this.options.resources.databases.find((d) => d.name === request.resource)?.protocol;
    if (!protocol) {
      // Connected, yet not among the databases of the hello: nothing says how to check it, so it is not served.
      this.log.warn({ user: request.user, database: request.resource }, 'database connection refused: its protocol is not known');
      target.destroy();
      channel.destroy();
      return;
    }
    this.serveDatabase(channel, target, request, protocol, onOpen);
  }

  /**
   * A probe (src/tunnel/protocol.ts): the resource's check, the answer, one ProbeReport line, the end. Nothing of
   * the resource passes. SSH is this agent's own SSH Service (in this process): answering is its check.
   */
  private async answerProbe(channel: Duplex, request: DialRequest, reach: NonNullable<TunnelAgentOptions['reachResource']>): Promise<void> {
    if (request.service === 'ssh' && this.options.serveSsh) {
      writeJsonLine(channel, { ok: true } satisfies DialAnswer);
      channel.end(`${JSON.stringify({ hop: 'resource', ms: 0, detail: 'the SSH Service runs in the agent' } satisfies ProbeReport)}\n`);
      return;
    }
    let ms: number;
    try {
      ms = await reach(request.service, request.resource, PROBE_RESOURCE_TIMEOUT_MS);
    } catch (err) {
      const e = toGatewayError(err);
      this.log.info({ service: request.service, resource: request.resource, code: e.code, err: e.message }, 'probe: the resource does not answer');
      channel.end(`${JSON.stringify({ ok: false, error: { code: e.code, message: e.message } } satisfies DialAnswer)}\n`);
      return;
    }
    writeJsonLine(channel, { ok: true } satisfies DialAnswer);
    channel.end(`${JSON.stringify({ hop: 'resource', ms } satisfies ProbeReport)}\n`);
  }

  /** The database access rules (dbgate.ts), then the splice; a refusal is answered there and logged here. */
  private serveDatabase(channel: Duplex, target: Duplex, request: DialRequest, protocol: DatabaseInfo['protocol'], onOpen?: (fields: Record<string, unknown>) => void): void {
    const who = { user: request.user, client: request.client_src, database: request.resource, protocol };
    gateDatabase(channel, target, { protocol, grant: request.db_access, timeoutMs: DATABASE_STARTUP_TIMEOUT_MS }).then(
      ({ startup, client }) => {
        this.log.info({ ...who, dbUser: startup.user, dbName: startup.database }, 'database session opened');
        onOpen?.({ protocol, db_user: startup.user, db_name: startup.database });
        splice(client, target);
      },
      (err: unknown) => {
        const e = toGatewayError(err);
        this.log.warn({ ...who, code: e.code, err: e.message }, 'database connection refused');
      },
    );
  }

  /** Stops and closes the tunnel; no more retries. */
  stop(): void {
    this.stopped = true;
    this.retry.stop();
    this.heartbeat?.stop();
    this.dataPool?.detach();
    this.client?.end();
    this.session?.end();
    this.heldProxy = undefined;
    this.setState('stopped');
  }
}

/**
 * The Proxy refused the agent (SSH authentication, or `refused` on v2). Neither says why; what the agent can tell is whether its
 * identity is from the cluster the Proxy serves (GET /webapi/find names it).
 */
function refusedError(identity: HostIdentity, find: FindResponse): GatewayError {
  const hint = 'Remove the host directory in the data directory and join this cluster again with a new token (gwctl tokens add).';
  if (find.cluster_name && find.cluster_name !== identity.cluster) {
    return new GatewayError(
      'GW_ERR_TUNNEL_AUTH',
      `the Proxy at ${identity.server} (cluster "${find.cluster_name}") refused this agent: its host identity ${identity.hostId} belongs to cluster "${identity.cluster}"`,
      { hint },
    );
  }
  const validTo = Date.parse(new X509Certificate(identity.cert).validTo);
  if (validTo < Date.now()) {
    return new GatewayError('GW_ERR_TUNNEL_AUTH', `the Proxy at ${identity.server} refused this agent: its host certificate expired at ${new Date(validTo).toISOString()} (it renews itself from two thirds of its life on, while a tunnel is up; the agent log says why it did not)`, {
      hint: `Check this machine's clock (date -u); an agent that was offline past its certificate's expiry must join again: ${hint}`,
    });
  }
  return new GatewayError(
    'GW_ERR_TUNNEL_AUTH',
    `the Proxy at ${identity.server} refused this agent's host identity ${identity.hostId}: the cluster does not know this host (it was removed, the agent is locked, or the identity was not issued by this cluster)`,
    { hint },
  );
}

/**
 * A TLS handshake that the path broke rather than the Proxy refused: the server knows none of the tunnel's ALPN
 * names (something other than the Proxy ends TLS there), or the connection was reset or closed mid-handshake. The
 * next rung may work; an alert about this agent's certificate is a refusal and stays one.
 */
function pathBroke(err: Error & { code?: string }): boolean {
  return err.code === 'ERR_SSL_TLSV1_ALERT_NO_APPLICATION_PROTOCOL' || err.code === 'ECONNRESET' || err.code === 'EPIPE';
}

/**
 * On raw SSH, the Proxy whose tunnel host key is `key`, as the verified /webapi/find lists them (tunnel_proxies);
 * undefined when it does not say (a Proxy of an earlier version).
 */
function proxyOfHostKey(find: FindResponse, key: Buffer): string | undefined {
  for (const p of Array.isArray(find.tunnel_proxies) ? find.tunnel_proxies : []) {
    if (typeof p?.proxy_id !== 'string' || typeof p.host_key !== 'string') continue;
    const parsed = sshModule!.utils.parseKey(p.host_key);
    if (!(parsed instanceof Error) && !Array.isArray(parsed) && parsed.getPublicSSH().equals(key)) return p.proxy_id;
  }
  return undefined;
}

/**
 * The ok answer, and the stream the session then runs on: in frames that say their end (src/stream/framed.ts) when
 * the request asked for them (an end-to-end stream: inside its TLS a FIN without close_notify would read as a clean
 * end, so a Proxy that cuts the stream could pass a truncated transfer for a whole one).
 */
function answerOk(channel: Duplex, request: DialRequest): Duplex {
  if (request.framed !== true) {
    writeJsonLine(channel, { ok: true } satisfies DialAnswer);
    return channel;
  }
  writeJsonLine(channel, { ok: true, framed: true } satisfies DialAnswer);
  return new FramedStream(channel);
}
