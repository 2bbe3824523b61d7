/**
 * The agent's transport ladder: the one file that decides which way an agent's tunnel reaches the Proxy, and
 * when it moves to a better one. The rungs, best first (docs/tunnels.md, "The transport ladder"):
 *
 *   alpn         TLS with ALPN gateway-reversetunnel-v2 / -v1 on the Proxy's web address (the one port), when the
 *                Proxy routes by ALPN there (tls_routing_enabled: proxy_listener_mode multiplex).
 *   tunnel-port  raw SSH to ssh_tunnel_public_addr, when the Proxy advertises a port of its own for it
 *                (separate mode; or multiplex with proxy_service.tunnel_public_addr set, which binds the tunnel
 *                listener beside the one port).
 *   upgrade      the tunnel's own mutual TLS inside an HTTP/1.1 upgrade on the web address, through a proxy that
 *                inspects TLS: only when the agent was given an opener for it (TunnelAgentOptions.openUpgrade).
 *
 * How it decides (pure functions below; the Ladder class holds what it remembers):
 *
 *   start    at the rung that last worked (remembered in memory for the process's life), else the best one
 *   fall     a failure that means "this path does not work from here" (fallsThrough: a dial that failed or timed
 *            out, a proxy that refused the CONNECT, TLS inspected or stalled, a certificate that is not the
 *            cluster's, ALPN not accepted) moves to the next rung at once; an answer from the cluster itself (a
 *            refusal, a lock) does not: the attempt fails as it always did and the retry follows
 *   climb    while on a lower rung, the better rungs are probed in the background: LADDER_PROBE, 30-60 s then
 *            doubling to 7.5-15 min (equal jitter), reset only once a rung reached by a move stayed up 30 min; a
 *            probe is a whole tunnel brought up on the better rung (a handshake that completes, a welcome that
 *            names a Proxy of this cluster); when it works the agent moves and drains the old tunnel
 *   no thrash  at most LADDER_MOVES.maxMoves moves (3) per windowMs (1 h): a flapping rung stops being probed
 *            until the window has room again
 *
 * Every decision comes with a reason a command (or the log) can print. Written here, not taken from a library:
 * the rungs and what counts as a path failure are this gateway's own errors and wire.
 */
import { Backoff, type BackoffDeps, type BackoffPolicy } from '../backoff.js';
import type { GatewayError } from '../errors.js';
import type { FindResponse } from '../wire/ping.js';

export type RungName = 'alpn' | 'tunnel-port' | 'upgrade';

/** One way to the Proxy: which, and the address dialled. */
export interface Rung {
  name: RungName;
  addr: string;
}

/** What each rung is, as a reason line says it. */
export const RUNG_TEXT: Readonly<Record<RungName, string>> = {
  alpn: 'TLS with ALPN on the web address',
  'tunnel-port': 'raw SSH on the reverse-tunnel port',
  upgrade: 'the tunnel inside an HTTP/1.1 upgrade on the web address',
};

/** The background re-probe of a better rung (docs/tunnels.md): minutes, not seconds. */
export const LADDER_PROBE: BackoffPolicy = { firstMs: 60_000, maxMs: 15 * 60_000, jitter: 'equal', resetAfterMs: 30 * 60_000 };

/** At most maxMoves climbs per windowMs, whatever the probes find. */
export const LADDER_MOVES = { maxMoves: 3, windowMs: 60 * 60_000 } as const;

/**
 * The rungs a /webapi/find answer offers, best first. `server` is the address the agent joined through (used
 * when the Proxy names no public address); `upgrade` says whether this agent can open the upgrade rung.
 */
export function rungsOf(find: FindResponse, server: string, options: { upgrade?: boolean } = {}): Rung[] {
  const web = find.proxy.ssh.public_addr || server;
  const rungs: Rung[] = find.proxy.tls_routing_enabled ? [{ name: 'alpn', addr: web }] : [];
  const tunnel = find.proxy.ssh.ssh_tunnel_public_addr;
  if (tunnel && (!find.proxy.tls_routing_enabled || tunnel !== web)) rungs.push({ name: 'tunnel-port', addr: tunnel });
  if (options.upgrade) rungs.push({ name: 'upgrade', addr: web });
  return rungs;
}

/**
 * Codes that say the path does not work from here: the next rung may. Anything else (GW_ERR_TUNNEL_AUTH: the
 * cluster refused this agent, or its Proxy is not who it says) is an answer no other path changes.
 */
const PATH_CODES = new Set(['GW_ERR_CLIENT_UNTRUSTED', 'GW_ERR_TUNNEL_DOWN', 'GW_ERR_TUNNEL_RUNG', 'GW_ERR_DIAL_PROBE_FAILED']);

export function fallsThrough(err: GatewayError): boolean {
  if (PATH_CODES.has(err.code)) return true;
  return err.code.startsWith('GW_ERR_DIAL_') || (err.code.startsWith('GW_ERR_TLS_') && err.code !== 'GW_ERR_TLS_CERT_EXPIRED');
}

/** The reason line for a fall: which rung failed, how, and what is tried next (or that none is left). */
export function fallReason(from: Rung, err: GatewayError, next: Rung | undefined): string {
  const then = next ? `trying ${next.name} (${RUNG_TEXT[next.name]}, ${next.addr})` : 'no rung left';
  return `${from.name} (${RUNG_TEXT[from.name]}, ${from.addr}) does not work from here: ${err.code}: ${err.message}; ${then}`;
}

/** The reason line for a move up. */
export function climbReason(from: RungName, to: Rung): string {
  return `${to.name} (${RUNG_TEXT[to.name]}, ${to.addr}) works again: moving the tunnel up from ${from}; the old tunnel drains`;
}

/** The rungs better than `current` among `rungs` (empty when current is the best, or unknown). */
export function betterThan(rungs: readonly Rung[], current: RungName | undefined): Rung[] {
  const at = rungs.findIndex((r) => r.name === current);
  return at > 0 ? rungs.slice(0, at) : [];
}

/** Whether a move may happen now (pure): the moves made within the window, oldest first. */
export function mayMove(moves: readonly number[], now: number, policy: { maxMoves: number; windowMs: number } = LADDER_MOVES): { ok: boolean; reason: string } {
  const recent = moves.filter((t) => now - t < policy.windowMs);
  if (recent.length < policy.maxMoves) return { ok: true, reason: `${recent.length} of ${policy.maxMoves} moves in the last ${policy.windowMs} ms` };
  const waitMs = policy.windowMs - (now - recent[0]!);
  return { ok: false, reason: `${recent.length} moves in the last ${policy.windowMs} ms (at most ${policy.maxMoves}): no probe for ${waitMs} ms` };
}

export interface LadderOptions {
  probe?: Partial<BackoffPolicy>;
  moves?: { maxMoves: number; windowMs: number };
  deps?: BackoffDeps;
}

/**
 * What one agent remembers of its ladder (shared by the tunnels of its pool: which rung works is a property of
 * the network it sits in): the rung that last worked, when it moved, and the probe's backoff.
 */
export class Ladder {
  private worked: RungName | undefined;
  private readonly moves: number[] = [];
  readonly probe: Backoff;
  readonly movePolicy: { maxMoves: number; windowMs: number };
  private readonly now: () => number;

  constructor(options: LadderOptions = {}) {
    this.probe = new Backoff({ ...LADDER_PROBE, ...options.probe }, options.deps);
    this.movePolicy = options.moves ?? LADDER_MOVES;
    this.now = options.deps?.now ?? Date.now;
  }

  /** The rung that last carried a tunnel, if any. */
  get current(): RungName | undefined {
    return this.worked;
  }

  /** Where an attempt starts among `rungs`: the remembered rung, else the best. */
  startAt(rungs: readonly Rung[]): number {
    const at = rungs.findIndex((r) => r.name === this.worked);
    return at < 0 ? 0 : at;
  }

  /** A tunnel came up on this rung. */
  up(rung: RungName): void {
    this.worked = rung;
  }

  /** Every rung failed: the next attempt starts at the best again. */
  forget(): void {
    this.worked = undefined;
  }

  /** Whether a probe may be started now, with its reason. */
  mayMove(): { ok: boolean; reason: string } {
    return mayMove(this.moves, this.now(), this.movePolicy);
  }

  /** A move happened (counted against the window); the probe's backoff restarts only if the new rung stays up. */
  moved(to: RungName): void {
    const now = this.now();
    this.moves.push(now);
    while (this.moves.length > 0 && now - this.moves[0]! >= this.movePolicy.windowMs) this.moves.shift();
    this.worked = to;
    this.probe.up();
  }
}
