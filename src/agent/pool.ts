/**
 * The agent pool: the reverse tunnels of one agent when several Proxies run behind one address (a load
 * balancer's). The agent can only dial that address; which Proxy a connection lands on is the balancer's
 * choice. So, as Teleport's agent pool does, it dials again and again until it holds the tunnels it wants:
 *
 *   identify  the Proxy a tunnel reached is the host ID in its welcome (Teleport reads the Proxy's host ID from
 *             its host certificate in the SSH handshake). The connection is already authenticated: over TLS by
 *             the Proxy's certificate from the cluster's host CA, on raw SSH by a host key /webapi/find lists.
 *   how many  from the newest discovery (every live Proxy and auth_service.tunnel_strategy): agent_mesh, one
 *             tunnel per Proxy listed; proxy_peering, agent_connection_count of them (no more than are listed).
 *             Before any discovery: one. Never more than maxLinks (MAX_POOL_LINKS, 32), whatever a discovery
 *             says: a list of 10 000 Proxies, or a count of a billion, opens at most 32 tunnels.
 *   duplicate each tunnel (a TunnelAgent) sends in its hello the Proxies the others hold; a Proxy named there
 *             answers `duplicate` and the tunnel closes and dials again after its backoff (each tunnel its own
 *             Backoff with TUNNEL_RETRY of ./tunnel.ts, or the pool's `backoff`: 0.25-0.5 s, doubling to 5 s,
 *             equal jitter). A welcome from a Proxy another tunnel holds (a Proxy that lost the old one
 *             without noticing yet) replaces that one, as the Proxy itself does.
 *   rate      every dial of every tunnel waits for the pool's DialGate (a token bucket: dialsPerSecond, 4 by
 *             default, bursts of dialBurst, 4): a pool that keeps landing on Proxies it holds does not hammer
 *             the balancer.
 *   leave     a Proxy missing from the newest discovery has its tunnel dropped, and the pool shrinks to what the
 *             discovery asks for: no tunnel keeps redialling a Proxy that is gone. A discovery that does not
 *             list the Proxy that sent it is ignored (a Proxy always lists itself once its view is loaded).
 *   die       a tunnel that dies dials again (TunnelAgent's own retry); a reconnect notice (graceful shutdown of
 *             a Proxy) dials again at once, and lands on another Proxy or is refused.
 *   climb     the transport ladder (./ladder.ts, one Ladder for the pool): a tunnel up on a lower rung gets a
 *             probe of the better rungs after LADDER_PROBE's delay (one probe at a time, at most probeTimeoutMs,
 *             60 s, to be welcomed): a TunnelAgent limited to those rungs, trying once, holds as its tunnel's,
 *             drain_previous in its hello. Welcomed: it takes its tunnel's place (new dials go to it; the Proxy
 *             it reached drains the old one on its side) and the old tunnel drains (TunnelAgent.drain: its
 *             streams finish, at most drainCapMs, TUNNEL_DRAIN_CAP_MS). Failed, or landed on a Proxy another
 *             tunnel holds (duplicate): the next probe after the backoff. No more than the ladder's moves per
 *             window. Each move and each failed probe is logged with its reason ('transport ladder').
 *
 *   hand-over a new process's tunnels take over from the process before (options.takeOver: their first hello
 *             drains, for the drain limit, the tunnel it replaces on each Proxy). The process before holds its
 *             tunnels (hold(): they serve, but a closed one is not dialled again, so it cannot cut the successor's)
 *             and, once the successor is ready, drains them all (drainAll: new dials refused, the streams in
 *             flight finish, at most the drain limit). src/handover.ts drives both.
 *
 * To its users (src/roles/agent.ts) the pool is what one TunnelAgent was: start, stop, getState ('connected'
 * while at least one tunnel is), sendEvent (over one live tunnel, queued while none is), requestRenewal (over one
 * live tunnel), and the events
 * 'connected' (proxyId), 'disconnected', 'state', 'failure', 'maintenance-changed', 'discovery'; plus 'links'
 * (the Proxy IDs held, whenever they change) and links() for tests and the log line "agent tunnels".
 */
import { EventEmitter } from 'node:events';
import { GatewayError, toGatewayError } from '../errors.js';
import { logger } from '../log.js';
import { TUNNEL_DRAIN_CAP_MS, type DiscoveryMessage } from '../tunnel/protocol.js';
import { climbReason, Ladder, type LadderOptions, type Rung, type RungName } from './ladder.js';
import type { RenewedCerts } from './renewal.js';
import type { AgentHealth } from '../wire/autoupdate.js';
import { TunnelAgent, type TunnelAgentOptions, type TunnelState } from './tunnel.js';
import { DataPools } from './e2edata.js';

/** The most tunnels one agent keeps, whatever a discovery lists: more Proxies than this want proxy_peering. */
export const MAX_POOL_LINKS = 32;
const MAX_QUEUED_EVENTS = 1000;

/** How long a probe of a better rung may take to be welcomed before it counts as failed. */
export const PROBE_TIMEOUT_MS = 60_000;

export interface AgentPoolOptions extends Omit<TunnelAgentOptions, 'holds' | 'gate' | 'ladder' | 'rungs' | 'probe' | 'find'> {
  /** The transport ladder's probe backoff and move cap (tests shorten them). */
  ladderOptions?: LadderOptions;
  /** How long a probe may take to be welcomed (default PROBE_TIMEOUT_MS). */
  probeTimeoutMs?: number;
  /** How long a replaced tunnel may drain (default TUNNEL_DRAIN_CAP_MS). */
  drainCapMs?: number;
  /** At most this many tunnels (default MAX_POOL_LINKS; 1 for an agent whose only Proxy is in its process). */
  maxLinks?: number;
  /** Dials per second of the whole pool (the balancer's address), and the burst allowed. */
  dialsPerSecond?: number;
  dialBurst?: number;
}

/** What the pool knows of the cluster: the newest valid discovery. */
export interface PoolView {
  ids: ReadonlySet<string>;
  strategy: NonNullable<DiscoveryMessage['strategy']>;
}

/** How many tunnels the pool wants for a view (pure): see the file comment. */
export function desiredLinks(view: PoolView | undefined, maxLinks = MAX_POOL_LINKS): number {
  const cap = Math.max(1, Math.floor(maxLinks));
  if (!view) return 1;
  const listed = Math.max(1, view.ids.size);
  const want = view.strategy.type === 'proxy_peering' ? Math.min(Math.max(1, view.strategy.agent_connection_count), listed) : listed;
  return Math.min(want, cap);
}

/** A token bucket for dials: wait() resolves when a dial may start. close() lets every waiter go. */
export class DialGate {
  private tokens: number;
  private last = Date.now();
  private readonly waiters: Array<() => void> = [];
  private timer: NodeJS.Timeout | undefined;
  private closed = false;

  constructor(
    private readonly perSecond: number,
    private readonly burst: number,
  ) {
    if (!(perSecond > 0) || !(burst >= 1)) throw new GatewayError('GW_ERR_INTERNAL', `dial gate: ${perSecond}/s with bursts of ${burst}`);
    this.tokens = burst;
  }

  wait(): Promise<void> {
    if (this.closed) return Promise.resolve();
    return new Promise((resolve) => {
      this.waiters.push(resolve);
      this.drain();
    });
  }

  private drain(): void {
    const now = Date.now();
    this.tokens = Math.min(this.burst, this.tokens + ((now - this.last) * this.perSecond) / 1000);
    this.last = now;
    while (this.waiters.length > 0 && this.tokens >= 1) {
      this.tokens -= 1;
      this.waiters.shift()!();
    }
    if (this.waiters.length > 0 && !this.timer) {
      this.timer = setTimeout(() => {
        this.timer = undefined;
        this.drain();
      }, Math.ceil(((1 - this.tokens) * 1000) / this.perSecond));
    }
  }

  close(): void {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    for (const release of this.waiters.splice(0)) release();
  }
}

export class AgentPool extends EventEmitter {
  private readonly log = logger('agent-pool');
  private readonly slots: TunnelAgent[] = [];
  /** proxyId → the tunnel that holds it. */
  private readonly holders = new Map<string, TunnelAgent>();
  private readonly gate: DialGate;
  private readonly maxLinks: number;
  private view: PoolView | undefined;
  private readonly pending: Array<Record<string, unknown>> = [];
  private state: TunnelState = 'waiting';
  private stopped = true;
  private logged = '';
  readonly ladder: Ladder;
  /** The probe of a better rung in progress, if any. */
  private probe: TunnelAgent | undefined;
  /** A probe is scheduled (the ladder's backoff timer runs). */
  private probeDue = false;
  /** Tunnels replaced by a move, draining. */
  private readonly draining = new Set<TunnelAgent>();
  /** hold(): tunnels are not dialled again (a hand-over in progress). */
  private held = false;
  /** The data connections for end-to-end streams, per dialled address, of all the tunnels (options.e2e). */
  private readonly dataPools: DataPools;

  constructor(private readonly options: AgentPoolOptions) {
    super();
    this.ladder = new Ladder(options.ladderOptions);
    this.maxLinks = Math.max(1, Math.min(options.maxLinks ?? MAX_POOL_LINKS, MAX_POOL_LINKS));
    this.gate = new DialGate(options.dialsPerSecond ?? 4, options.dialBurst ?? 4);
    this.dataPools = options.e2e?.pools ?? new DataPools();
  }

  start(): void {
    this.stopped = false;
    this.ladder.probe.resume();
    this.reconcile();
  }

  /** Stops every tunnel; no more dials. */
  stop(): void {
    this.stopped = true;
    this.ladder.probe.stop();
    this.probeDue = false;
    this.probe?.stop();
    this.probe = undefined;
    for (const old of this.draining) old.stop();
    this.draining.clear();
    this.gate.close();
    for (const slot of this.slots.splice(0)) this.retire(slot);
    this.holders.clear();
    this.updateState();
  }

  getState(): TunnelState {
    return this.state;
  }

  /**
   * A hand-over started (on) or failed (off): while held, no tunnel is added, probed or dialled again, and those
   * up keep serving. Released, the pool dials what is down.
   */
  hold(on: boolean): void {
    this.held = on;
    if (on) {
      this.ladder.probe.stop();
      this.probeDue = false;
      this.probe?.stop();
      this.probe = undefined;
    } else if (!this.stopped) {
      this.ladder.probe.resume();
    }
    for (const slot of this.slots) slot.hold(on);
    if (!on) this.reconcile();
  }

  /**
   * Stops taking new streams and lets the ones in flight finish: every tunnel drains (refusing new dials with
   * GW_ERR_AGENT_DRAINING) for at most limitMs, then closes with what is left. Resolves once all are closed.
   */
  async drainAll(limitMs: number, why: string): Promise<void> {
    this.hold(true);
    this.stopped = true;
    const all = [...this.slots, ...this.draining];
    await Promise.all(all.map((slot) => slot.drain(limitMs, { refuseNew: true, why })));
    this.stop();
  }

  /** Sessions (streams) in flight on every tunnel, draining ones included. */
  streams(): number {
    return [...this.slots, ...this.draining].reduce((n, s) => n + s.streams, 0);
  }

  /** The Proxies (host IDs) this agent holds a tunnel to, sorted. */
  links(): string[] {
    return [...this.holders.keys()].sort();
  }

  /** Tunnels kept, up or dialling: what the pool wants now. */
  get size(): number {
    return this.slots.length;
  }

  /** What the pool knows of the cluster (the newest valid discovery). */
  cluster(): PoolView | undefined {
    return this.view;
  }

  /** Sends an audit event over one live tunnel (queued, at most 1 000, while none is). */
  sendEvent(event: Record<string, unknown>): void {
    const live = this.slots.find((s) => s.getState() === 'connected');
    if (live) return live.sendEvent(event);
    this.pending.push(event);
    if (this.pending.length > MAX_QUEUED_EVENTS) this.pending.shift();
  }

  /**
   * Asks the live tunnels' Proxies for fresh host certificates (src/agent/renewal.ts), one after the other while a
   * Proxy does not answer (one of an earlier version) or its tunnel goes; fails while none is live.
   */
  async requestRenewal(publicKeyPem: string): Promise<RenewedCerts> {
    let last: unknown = new GatewayError('GW_ERR_TUNNEL_DOWN', 'no reverse tunnel is connected to ask for a renewal');
    for (const slot of this.slots.filter((s) => s.getState() === 'connected')) {
      try {
        return await slot.requestRenewal(publicKeyPem);
      } catch (err) {
        if (!(err instanceof GatewayError) || (err.code !== 'GW_ERR_TUNNEL_TIMEOUT' && err.code !== 'GW_ERR_TUNNEL_DOWN')) throw err;
        last = err;
      }
    }
    throw last;
  }

  /** The agent's health changed (src/agent/rollout.ts): every live tunnel's Proxy hears it. */
  sendHealth(health: AgentHealth): void {
    for (const slot of this.slots) slot.sendHealth(health);
  }

  /** The agent's SSH host certificate changed (a renewal): every live tunnel's Proxy hears it (protocol.ts host-cert). */
  announceHostCert(sshCert: string): void {
    for (const slot of this.slots) slot.announceHostCert(sshCert);
  }

  private tunnelOptions(): TunnelAgentOptions {
    const e2e = this.options.e2e;
    // One DataPools for every tunnel: behind a load balancer they dialled one address, whose data connections land
    // on any of their Proxies (src/agent/e2edata.ts).
    return { ...this.options, ladder: this.ladder, gate: () => this.gate.wait(), ...(e2e ? { e2e: { ...e2e, pools: this.dataPools } } : {}) };
  }

  /** The Proxies the other tunnels hold (what `slot`'s hello says), for a tunnel or the probe that stands for it. */
  private heldByOthers(slot: TunnelAgent): string[] {
    return [...this.holders.entries()].filter(([, s]) => s !== slot).map(([id]) => id);
  }

  private addSlot(): void {
    const slot: TunnelAgent = new TunnelAgent({ ...this.tunnelOptions(), holds: () => this.heldByOthers(slot) });
    if (this.held) slot.hold(true);
    this.slots.push(slot);
    this.listen(slot);
    slot.start();
  }

  private listen(slot: TunnelAgent): void {
    slot.on('connected', (proxyId: string) => this.onConnected(slot, proxyId));
    slot.on('disconnected', (reason: string) => {
      this.release(slot);
      this.emit('disconnected', reason);
      this.updateState();
    });
    slot.on('discovery', (proxies: DiscoveryMessage['proxies'], strategy: DiscoveryMessage['strategy']) => this.onDiscovery(slot, proxies, strategy));
    slot.on('duplicate', (proxyId: string) => this.emit('duplicate', proxyId));
    slot.on('failure', (err: GatewayError) => this.emit('failure', err));
    slot.on('maintenance-changed', () => this.emit('maintenance-changed'));
    slot.on('state', () => this.updateState());
  }

  /** Stops a tunnel for good; what it had queued goes to the pool's queue. */
  private retire(slot: TunnelAgent): void {
    this.release(slot);
    slot.stop();
    slot.removeAllListeners();
    for (const event of slot.takePending()) this.sendEvent(event);
  }

  private release(slot: TunnelAgent): void {
    for (const [id, s] of this.holders) if (s === slot) this.holders.delete(id);
    this.logLinks();
  }

  private onConnected(slot: TunnelAgent, proxyId: string): void {
    const other = this.holders.get(proxyId);
    this.release(slot);
    if (other && other !== slot) {
      // The Proxy took this tunnel as the agent's current one: it has closed (or will close) the older one.
      this.holders.delete(proxyId);
      other.drop('a newer tunnel to the same Proxy replaced it');
    }
    this.holders.set(proxyId, slot);
    for (const event of this.pending.splice(0)) slot.sendEvent(event);
    this.emit('connected', proxyId);
    this.updateState();
    this.reconcile();
    this.planProbe();
  }

  // --- the transport ladder's climb --------------------------------------------------------------------------

  /** A live tunnel on a lower rung, and no probe planned or running: the next probe, after the ladder's backoff. */
  private planProbe(): void {
    if (this.stopped || this.held || this.probe || this.probeDue) return;
    if (!this.slots.some((s) => s.betterRungs().length > 0)) return;
    const delay = this.ladder.probe.next();
    this.log.info({ probeInMs: delay, rung: this.ladder.current }, 'transport ladder: a better rung will be probed');
    this.probeDue = true;
    this.ladder.probe.schedule(() => {
      this.probeDue = false;
      this.startProbe();
    }, delay);
  }

  private startProbe(): void {
    const old = this.slots.find((s) => s.betterRungs().length > 0);
    if (this.stopped || !old || this.probe) return;
    const allowed = this.ladder.mayMove();
    if (!allowed.ok) {
      this.log.info({ reason: allowed.reason }, 'transport ladder: not probing (too many moves)');
      return this.planProbe();
    }
    const better = old.betterRungs();
    const from = old.rung!;
    const { takeOver: _first, ...options } = this.tunnelOptions(); // a probe drains its own tunnel, for the ladder's cap
    const probe: TunnelAgent = new TunnelAgent({
      ...options,
      rungs: better.map((r) => r.name),
      probe: true,
      ...(old.findAnswer ? { find: old.findAnswer } : {}),
      holds: () => this.heldByOthers(old),
    });
    this.probe = probe;
    const timer = setTimeout(() => failed(new GatewayError('GW_ERR_TUNNEL_RUNG', `the probe of ${better.map((r) => r.name).join(', ')} was not welcomed within ${this.options.probeTimeoutMs ?? PROBE_TIMEOUT_MS} ms`)), this.options.probeTimeoutMs ?? PROBE_TIMEOUT_MS);
    timer.unref();
    const failed = (err: unknown) => {
      if (this.probe !== probe) return;
      clearTimeout(timer);
      this.probe = undefined;
      probe.removeAllListeners();
      probe.stop();
      const e = toGatewayError(err);
      this.log.info({ rungs: better.map((r) => r.name), rung: from, code: e.code, reason: `probe of ${better.map((r) => r.name).join(', ')} failed: ${e.message}; staying on ${from}` }, 'transport ladder: probe failed');
      this.planProbe();
    };
    probe.once('probe-failed', failed);
    probe.once('connected', () => {
      if (this.probe !== probe) return;
      clearTimeout(timer);
      this.probe = undefined;
      probe.removeAllListeners();
      this.move(old, probe, from, better.find((r) => r.name === probe.rung) ?? better[0]!);
    });
    probe.start();
  }

  /** The probe was welcomed: it takes the old tunnel's place, which drains. */
  private move(old: TunnelAgent, probe: TunnelAgent, from: RungName, rung: Rung): void {
    const to = rung.name;
    this.ladder.moved(to);
    probe.promote();
    const at = this.slots.indexOf(old);
    if (at < 0 || this.stopped) {
      probe.stop();
      return;
    }
    this.slots[at] = probe;
    this.release(old);
    old.removeAllListeners();
    this.listen(probe);
    this.draining.add(old);
    void old.drain(this.options.drainCapMs ?? TUNNEL_DRAIN_CAP_MS).then(() => this.draining.delete(old));
    this.log.info({ from, to, proxyId: probe.proxyId, reason: climbReason(from, rung) }, 'transport ladder: moved');
    this.emit('moved', from, to);
    this.onConnected(probe, probe.proxyId!);
  }

  private onDiscovery(slot: TunnelAgent, proxies: DiscoveryMessage['proxies'], strategy: DiscoveryMessage['strategy']): void {
    const sender = slot.proxyId;
    if (!sender || !proxies.some((p) => p.id === sender)) {
      this.log.debug({ sender, listed: proxies.length }, 'discovery that does not list its sender; ignored');
      return;
    }
    this.view = { ids: new Set(proxies.map((p) => p.id)), strategy: strategy ?? { type: 'agent_mesh' } };
    this.emit('discovery', proxies);
    this.reconcile();
  }

  /** Drops tunnels to Proxies that left, then grows or shrinks the pool to what the view asks for. */
  private reconcile(): void {
    if (this.stopped || this.held) return;
    const view = this.view;
    if (view) {
      for (const [id, slot] of [...this.holders]) {
        if (view.ids.has(id)) continue;
        this.holders.delete(id);
        slot.drop('the Proxy left the cluster');
      }
    }
    const want = desiredLinks(view, this.maxLinks);
    while (this.slots.length > want) {
      // Idle or dialling tunnels go first; then (proxy_peering asks for fewer) the newest live ones.
      const victim = this.slots.find((s) => s.proxyId === undefined) ?? this.slots[this.slots.length - 1]!;
      this.slots.splice(this.slots.indexOf(victim), 1);
      this.retire(victim);
    }
    while (this.slots.length < want) this.addSlot();
    this.logLinks();
    this.updateState();
  }

  private logLinks(): void {
    const links = this.links();
    const line = JSON.stringify([links, this.slots.length]);
    if (line === this.logged) return;
    this.logged = line;
    this.log.info({ proxies: links, want: this.slots.length, strategy: this.view?.strategy.type ?? 'agent_mesh' }, 'agent tunnels');
    this.emit('links', links);
  }

  private updateState(): void {
    const states = this.slots.map((s) => s.getState());
    const next: TunnelState = this.stopped ? 'stopped' : states.includes('connected') ? 'connected' : states.includes('connecting') ? 'connecting' : 'waiting';
    if (next === this.state) return;
    this.state = next;
    this.emit('state', next);
  }
}
