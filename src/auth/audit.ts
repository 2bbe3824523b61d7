/**
 * The audit log: one Backend record per event under /events/, kept 30 days. The Auth Service records what is
 * done through it (who did it, when, to what); cluster members report the sessions they carried, which are
 * recorded with the member that reported them.
 *
 * What a member may report is decided here, in REPORTABLE_EVENTS, and nowhere else: an agent reports the
 * sessions it serves, a Proxy the sessions it routes; neither ever reports a login, a join, a lock or any other
 * event the Auth Service itself records. Who reported an event is written by the Auth Service from the
 * reporter's authenticated identity (`reported_by`); a `by` or `reported_by` in the body is dropped, never
 * trusted. Whether a Proxy carries the agent it reports for is checked by memberchecks.ts before this. A Proxy
 * reports the sessions it carries (databases, apps, desktops, Kubernetes: src/proxy/sessionaudit.ts), at most
 * PROXY_EVENTS_PER_MINUTE a minute.
 */
import type { Backend } from '../backend/index.js';
import { GatewayError } from '../errors.js';
import { recordRateLimited } from '../metrics/ratelimit.js';
import type { Identity } from './pki.js';
import { KEYS } from './records.js';

/** The session events of every kind of resource: what agents serve and Proxies route. */
const SESSION_EVENTS = [
  'session.start', 'session.end',
  'db.session.start', 'db.session.end',
  'app.session.start', 'app.session.end',
  'desktop.session.start', 'desktop.session.end',
  'kube.session.start', 'kube.session.end',
] as const;

/**
 * The kinds of event each member may report: THE allowlist. An SSH session (`session.*`) is reported by the node
 * that ran it, never by a Proxy on its own account (a Proxy relays its agents' reports: `via`).
 */
export const REPORTABLE_EVENTS: { readonly agent: ReadonlySet<string>; readonly proxy: ReadonlySet<string> } = {
  agent: new Set(SESSION_EVENTS),
  proxy: new Set(SESSION_EVENTS.filter((e) => !e.startsWith('session.'))),
};

/** Who reported an event, as the Auth Service authenticated it. */
export type Reporter = { kind: 'agent'; hostId: string; nodename: string; via?: string } | { kind: 'proxy'; proxyId: string };

/** The kind of a reported event, when that reporter may report it; GW_ERR_MEMBER_EVENT_REFUSED otherwise. */
export function reportableKind(reporter: Reporter, event: Record<string, unknown>): string {
  const kind = event.event;
  const who = reporter.kind === 'agent' ? `agent ${reporter.hostId}${reporter.via ? ` (through Proxy ${reporter.via})` : ''}` : `Proxy ${reporter.proxyId}`;
  if (typeof kind === 'string' && REPORTABLE_EVENTS[reporter.kind].has(kind)) return kind;
  throw new GatewayError('GW_ERR_MEMBER_EVENT_REFUSED', `${who} may not report an event of kind ${JSON.stringify(typeof kind === 'string' ? kind.slice(0, 64) : kind ?? null)}`, {
    hint: `A${reporter.kind === 'agent' ? 'n agent' : ' Proxy'} reports only these kinds: ${[...REPORTABLE_EVENTS[reporter.kind]].join(', ')}.`,
    details: { reporter: reporter.kind },
  });
}

/** Audit events live 30 days in the backend. */
export const AUDIT_TTL_MS = 30 * 24 * 3600_000;
/** A member's reported event larger than this is refused (GW_ERR_API_BAD_REQUEST), nothing recorded. */
const MAX_AGENT_EVENT = 64 * 1024;

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

  /**
   * An audit event reported by an agent (its sessions), directly or relayed by the Proxy `via` that holds its
   * tunnel; who reported it is recorded with it. GW_ERR_MEMBER_EVENT_REFUSED for a kind an agent may not report.
   */
  async recordAgentEvent(hostId: string, nodename: string, event: Record<string, unknown>, via?: string): Promise<void> {
    const reporter: Reporter = { kind: 'agent', hostId, nodename, ...(via === undefined ? {} : { via }) };
    await this.recordReport(reportableKind(reporter, event), event, { host_id: hostId, nodename, ...(via === undefined ? {} : { via }) });
  }

  /**
   * A session a Proxy reports on its own account (proxyId: the host ID its certificate names, never a claim in the
   * body): GW_ERR_MEMBER_EVENT_REFUSED for other kinds, GW_ERR_AUDIT_RATE_LIMITED past PROXY_EVENTS_PER_MINUTE.
   */
  async recordProxyEvent(proxyId: string, event: Record<string, unknown>): Promise<void> {
    // The kind is checked before the event counts against the Proxy's budget: a refused kind spends none of it.
    const kind = reportableKind({ kind: 'proxy', proxyId }, event);
    this.countProxyEvent(proxyId);
    await this.recordReport(kind, event, { proxy_id: proxyId });
  }

  /** Stores event as `kind`, which the caller has checked (reportableKind) that its reporter may report. */
  private async recordReport(kind: string, event: Record<string, unknown>, reportedBy: Record<string, string>): Promise<void> {
    const { by: _by, reported_by: _reportedBy, ...fields } = event;
    const time = this.clock();
    const text = JSON.stringify({ ...fields, event: kind, reported_by: reportedBy });
    if (text.length > MAX_AGENT_EVENT) throw new GatewayError('GW_ERR_API_BAD_REQUEST', `the reported event is larger than ${MAX_AGENT_EVENT / 1024} KiB`, { hint: 'A session event carries its fields, not its data: a member that sends more is faulty or hostile; nothing was recorded.' });
    await this.backend.put(KEYS.event(time), text, { ttlMs: AUDIT_TTL_MS });
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
      recordRateLimited('audit');
      throw new GatewayError('GW_ERR_AUDIT_RATE_LIMITED', `Proxy ${proxyId} reported more than ${PROXY_EVENTS_PER_MINUTE} session events this minute`);
    }
  }

  async list(): Promise<AuditEvent[]> {
    return (await this.backend.range('/events/')).map((i) => ({ name: i.key.slice('/events/'.length), event: JSON.parse(i.value) as Record<string, unknown> }));
  }
}
