/**
 * The registry of what is open right now on behalf of an identity: proxied database, app, desktop, kube and SSH
 * connections of users, SSH jump connections, and agents' reverse tunnels. Whoever opens one tracks it here with
 * a close function; when a lock or a deletion arrives through the Backend's watch, the Auth Service re-checks the
 * identities concerned and the registry closes every session of those that no longer pass.
 *
 * One module for every kind of stream, so that "what does a lock close?" has one answer: everything tracked here.
 */
import type { GatewayError } from '../errors.js';
import type { Identity } from './pki.js';

export interface TrackedSession {
  readonly identity: Identity;
  /** For logs: the route and the client. */
  readonly what: string;
  readonly close: (reason: GatewayError) => void;
}

export class SessionRegistry {
  private readonly live = new Set<TrackedSession>();

  /** Tracks a session until the returned function is called (call it when the session ends; idempotent). */
  track(identity: Identity, what: string, close: (reason: GatewayError) => void): () => void {
    const session: TrackedSession = { identity, what, close };
    this.live.add(session);
    return () => void this.live.delete(session);
  }

  /** How many sessions are open (of identities that filter accepts). */
  count(filter: (identity: Identity) => boolean = () => true): number {
    return [...this.live].filter((s) => filter(s.identity)).length;
  }

  /**
   * Re-checks the identities of the open sessions that filter accepts (each distinct identity once) and closes
   * every session whose identity check gives a reason. Returns the sessions closed.
   */
  async revalidate(
    check: (identity: Identity) => Promise<GatewayError | undefined>,
    filter: (identity: Identity) => boolean = () => true,
  ): Promise<TrackedSession[]> {
    const groups = new Map<string, TrackedSession[]>();
    for (const s of this.live) {
      if (!filter(s.identity)) continue;
      const key = JSON.stringify([s.identity.kind, s.identity.name, s.identity.roles, s.identity.issuedAt ?? null]);
      groups.set(key, [...(groups.get(key) ?? []), s]);
    }
    const closed: TrackedSession[] = [];
    for (const group of groups.values()) {
      const reason = await check(group[0]!.identity);
      if (!reason) continue;
      for (const s of group) {
        if (!this.live.delete(s)) continue; // ended meanwhile
        closed.push(s);
        try {
          s.close(reason);
        } catch {
          // A close function that throws must not keep the others open.
        }
      }
    }
    return closed;
  }
}
