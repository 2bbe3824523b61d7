/**
 * Locks (Teleport's `tctl lock` model): a stored resource that refuses an identity until it is removed or
 * expires. A lock has one target: a user (by name), a role (every user holding it) or an agent (host ID).
 *
 * Locks live in the Backend under /locks/<name>, with the backend TTL set to their expiry, so an expired lock
 * is invisible to every reader at once. Every check reads the Backend (no cache that could lag); the Backend's
 * watch is what tells the processes of the cluster to close what is already open (callers.ts, sessions.ts).
 */
import type { Backend } from '../backend/index.js';
import { GatewayError } from '../errors.js';
import { LOCK_TARGET_KINDS, type LockResource, type LockTarget, type LockTargetKind } from './resources/index.js';

export const LOCKS_PREFIX = '/locks/';

export function lockKey(name: string): string {
  return `${LOCKS_PREFIX}${name}`;
}

/** What an identity can be locked through: its user name and roles, or its host ID. */
export interface LockSubject {
  user?: string;
  roles?: readonly string[];
  node?: string;
}

/** The one kind and value of a target; GW_ERR_RESOURCE_INVALID unless exactly one is given. */
export function targetOf(target: LockTarget | undefined): { kind: LockTargetKind; value: string } {
  const given = LOCK_TARGET_KINDS.filter((k) => typeof target?.[k] === 'string' && target[k] !== '');
  if (given.length !== 1) {
    throw new GatewayError('GW_ERR_RESOURCE_INVALID', given.length === 0 ? 'a lock needs a target: a user, a role or a node' : `a lock has exactly one target, not ${given.join(' and ')}`, {
      hint: 'gwctl lock --user NAME, --role NAME or --node HOST_ID (one per lock).',
    });
  }
  const kind = given[0]!;
  return { kind, value: target![kind]! };
}

export function describeTarget(target: LockTarget): string {
  const { kind, value } = targetOf(target);
  return kind === 'node' ? `agent ${value}` : `${kind} "${value}"`;
}

function live(lock: LockResource, now: number): boolean {
  return lock.spec.expires === undefined || Date.parse(lock.spec.expires) > now;
}

export function lockMatches(lock: LockResource, subject: LockSubject, now: number): boolean {
  if (!live(lock, now)) return false;
  const { user, role, node } = lock.spec.target;
  if (user !== undefined) return subject.user === user;
  if (role !== undefined) return (subject.roles ?? []).includes(role);
  return node !== undefined && subject.node === node;
}

/** The refusal for a locked identity: names the lock, its target, its message and until when. */
export function lockedError(lock: LockResource): GatewayError {
  const until = lock.spec.expires ? `until ${lock.spec.expires}` : 'until it is removed';
  const message = lock.spec.message ? `: ${lock.spec.message}` : '';
  return new GatewayError('GW_ERR_ACCESS_LOCKED', `${describeTarget(lock.spec.target)} is locked by lock "${lock.metadata.name}" (${until})${message}`, {
    hint: `An administrator lifts it with 'gwctl unlock ${lock.metadata.name}'${lock.spec.expires ? ', or it ends by itself at its expiry' : ''}.`,
    details: { lock: lock.metadata.name, target: lock.spec.target, ...(lock.spec.expires ? { expires: lock.spec.expires } : {}) },
  });
}

/** Reads locks from the Backend. */
export class LockStore {
  constructor(
    private readonly backend: Backend,
    private readonly clock: () => number,
  ) {}

  async list(): Promise<LockResource[]> {
    const now = this.clock();
    return (await this.backend.range(LOCKS_PREFIX)).map((i) => JSON.parse(i.value) as LockResource).filter((l) => live(l, now));
  }

  /** The first live lock that applies to subject, or undefined. */
  async find(subject: LockSubject): Promise<LockResource | undefined> {
    const now = this.clock();
    return (await this.list()).find((l) => lockMatches(l, subject, now));
  }

  /** Throws GW_ERR_ACCESS_LOCKED when a lock applies. */
  async check(subject: LockSubject): Promise<void> {
    const lock = await this.find(subject);
    if (lock) throw lockedError(lock);
  }
}
