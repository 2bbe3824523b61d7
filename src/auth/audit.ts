/**
 * The audit log: one Backend record per event under /events/, kept 30 days. The Auth Service records what is
 * done through it (who did it, when, to what); agents report their own events (SSH sessions), which are recorded
 * with the agent that reported them; Proxies report the sessions they carry (databases, apps, desktops, Kubernetes:
 * src/proxy/sessionaudit.ts), recorded with the Proxy that reported them and only of the kinds in PROXY_SESSION_EVENTS.
 */
import type { Backend } from '../backend/index.js';
import { GatewayError } from '../errors.js';
import type { Identity } from './pki.js';
import { KEYS } from './records.js';

/** Audit events live 30 days in the backend. */
export const AUDIT_TTL_MS = 30 * 24 * 3600_000;
/** An agent's event larger than this is dropped. */
const MAX_AGENT_EVENT = 64 * 1024;

/** The events a Proxy reports about the sessions it carries; anything else it sends is refused. */
export const PROXY_SESSION_EVENTS: ReadonlySet<string> = new Set(
  ['db', 'app', 'desktop', 'kube'].flatMap((kind) => [`${kind}.session.start`, `${kind}.session.end`]),
);

/**
 * The most session events one Proxy may report in a minute (a window per Proxy, counted by this Auth Service). A
 * Proxy writes at most 600 sessions a minute one by one (two records each), its coalesced records, and the ends of
 * the Web UI app sessions its idle sweep closes at once (at most the 6000 started in their 10 minutes); this is
 * above all of it. Beyond, the Auth Service refuses (GW_ERR_AUDIT_RATE_LIMITED, which the Proxy logs).
 */
export const PROXY_EVENTS_PER_MINUTE = 12_000;
/** Proxies whose window is kept (more, made-up IDs cannot be: a Proxy's ID is its certificate's). */
const MAX_PROXY_WINDOWS = 1000;

export interface AuditEvent {
  /** The record's key under /events/: time-ordered. */
  name: string;
  event: Record<string, unknown>;
}

export class AuditLog {
  /** Per Proxy: the start of its current minute and how many events it reported in it. */
  private readonly proxyWindows = new Map<string, { start: number; count: number }>();

  constructor(
    private readonly backend: Backend,
    private readonly clock: () => number,
  ) {}

  /** Records an event done by caller (undefined: no caller, such as a login or a join). */
  async record(event: string, caller: Identity | undefined, fields: Record<string, unknown>): Promise<void> {
    const time = this.clock();
    const record = { event, time: new Date(time).toISOString(), ...(caller ? { by: { kind: caller.kind, name: caller.name } } : {}), ...fields };
    await this.backend.put(KEYS.event(time), JSON.stringify(record), { ttlMs: AUDIT_TTL_MS });
  }

  /** An audit event reported by an agent (SSH sessions); who reported it is recorded with it. */
  async recordAgentEvent(hostId: string, nodename: string, event: Record<string, unknown>): Promise<void> {
    const time = this.clock();
    const text = JSON.stringify({ ...event, reported_by: { host_id: hostId, nodename } });
    if (text.length > MAX_AGENT_EVENT) return;
    await this.backend.put(KEYS.event(time), text, { ttlMs: AUDIT_TTL_MS });
  }

  /**
   * A session event reported by a Proxy (proxyId: the host ID its certificate names, never a claim in the body):
   * only the kinds of PROXY_SESSION_EVENTS, at most 64 KiB, recorded with the Proxy that reported it.
   */
  async recordProxyEvent(proxyId: string, event: Record<string, unknown>): Promise<void> {
    if (typeof event.event !== 'string' || !PROXY_SESSION_EVENTS.has(event.event)) {
      throw new GatewayError('GW_ERR_API_BAD_REQUEST', `a Proxy may not record "${String(event.event).slice(0, 64)}" events`, {
        hint: `A Proxy reports only the sessions it carries: ${[...PROXY_SESSION_EVENTS].join(', ')}.`,
      });
    }
    this.countProxyEvent(proxyId);
    const { reported_by: _claimed, ...rest } = event;
    const text = JSON.stringify({ ...rest, reported_by: { proxy: proxyId } });
    if (text.length > MAX_AGENT_EVENT) throw new GatewayError('GW_ERR_API_BAD_REQUEST', 'the session event is larger than 64 KiB');
    await this.backend.put(KEYS.event(this.clock()), text, { ttlMs: AUDIT_TTL_MS });
  }

  /** One more event of proxyId in its minute, or GW_ERR_AUDIT_RATE_LIMITED beyond PROXY_EVENTS_PER_MINUTE. */
  private countProxyEvent(proxyId: string): void {
    const now = this.clock();
    let window = this.proxyWindows.get(proxyId);
    if (!window || now - window.start >= 60_000) {
      if (!window && this.proxyWindows.size >= MAX_PROXY_WINDOWS) this.proxyWindows.delete(this.proxyWindows.keys().next().value!);
      window = { start: now, count: 0 };
      this.proxyWindows.set(proxyId, window);
    }
    if (++window.count > PROXY_EVENTS_PER_MINUTE) {
      throw new GatewayError('GW_ERR_AUDIT_RATE_LIMITED', `Proxy ${proxyId} reported more than ${PROXY_EVENTS_PER_MINUTE} session events this minute`);
    }
  }

  async list(): Promise<AuditEvent[]> {
    return (await this.backend.range('/events/')).map((i) => ({ name: i.key.slice('/events/'.length), event: JSON.parse(i.value) as Record<string, unknown> }));
  }
}
