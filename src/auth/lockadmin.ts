/**
 * Creating and removing locks (gwctl lock / unlock, and lock resources in manifests). locks.ts reads them; a
 * lock is stored with its expiry as the Backend TTL, and the Backend's watch closes what its target has open
 * (callers.ts).
 */
import { randomUUID } from 'node:crypto';
import type { Backend } from '../backend/index.js';
import { GatewayError, isGatewayError } from '../errors.js';
import type { Logger } from '../log.js';
import type { AuditLog } from './audit.js';
import type { CallerCheck } from './callers.js';
import { describeTarget, lockKey, targetOf, type LockStore } from './locks.js';
import type { Identity } from './pki.js';
import type { LockResource, LockTarget } from './resources/index.js';

const LOCK_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
/** A lock's message is cut to this many characters. */
const MAX_MESSAGE = 1024;

export interface LockRequest {
  target: LockTarget;
  message?: string;
  ttlMs?: number;
  expiresAt?: number;
  name?: string;
}

export interface LockAdminDeps {
  backend: Backend;
  clock: () => number;
  callers: CallerCheck;
  audit: AuditLog;
  store: LockStore;
  log: Logger;
}

export class LockAdmin {
  constructor(private readonly deps: LockAdminDeps) {}

  /**
   * Creates a lock (gwctl lock) that lasts ttlMs, until expiresAt, or until removed. Everything the target has
   * open is closed through the Backend's watch.
   */
  async createLock(caller: Identity, options: LockRequest): Promise<LockResource> {
    await this.deps.callers.authorize(caller, 'lock', 'create');
    const expiresAt = options.ttlMs === undefined ? options.expiresAt : this.deps.clock() + options.ttlMs;
    const lock = this.prepare(caller, {
      kind: 'lock',
      version: 'v2',
      metadata: { name: options.name ?? randomUUID() },
      spec: {
        target: options.target,
        ...(options.message ? { message: options.message } : {}),
        ...(expiresAt === undefined ? {} : { expires: new Date(expiresAt).toISOString() }),
      },
    });
    try {
      await this.deps.backend.create(lockKey(lock.metadata.name), JSON.stringify(lock), this.ttl(lock));
    } catch (err) {
      if (isGatewayError(err, 'GW_ERR_BACKEND_EXISTS')) {
        throw new GatewayError('GW_ERR_RESOURCE_EXISTS', `lock "${lock.metadata.name}" already exists`, { hint: 'Choose another --name, or leave it out for a generated one.' });
      }
      throw err;
    }
    this.deps.log.info({ lock: lock.metadata.name, target: lock.spec.target, expires: lock.spec.expires, by: caller.name }, 'lock created');
    await this.deps.audit.record('lock.create', caller, { name: lock.metadata.name, target: lock.spec.target, ...(lock.spec.expires ? { expires: lock.spec.expires } : {}) });
    return lock;
  }

  /** Removes one lock by name, or every lock on a target (gwctl unlock). Returns the names removed. */
  async removeLocks(caller: Identity, which: { name: string } | { target: LockTarget }): Promise<string[]> {
    await this.deps.callers.authorize(caller, 'lock', 'delete');
    let names: string[];
    if ('name' in which) {
      names = [which.name];
    } else {
      const { kind, value } = targetOf(which.target);
      names = (await this.deps.store.list()).filter((l) => l.spec.target[kind] === value).map((l) => l.metadata.name);
    }
    const removed: string[] = [];
    for (const name of names) if (await this.deps.backend.delete(lockKey(name))) removed.push(name);
    if (removed.length === 0) {
      throw new GatewayError('GW_ERR_RESOURCE_NOT_FOUND', 'name' in which ? `lock "${which.name}" does not exist` : `no lock on ${describeTarget(which.target)}`, {
        hint: "List locks with 'gwctl get locks'; an expired lock is gone by itself.",
      });
    }
    this.deps.log.info({ locks: removed, by: caller.name }, 'locks removed');
    await this.deps.audit.record('lock.delete', caller, { names: removed });
    return removed;
  }

  /** A lock from a manifest as it is stored, with its Backend TTL. */
  fromManifest(caller: Identity, resource: LockResource): { key: string; value: string; ttlMs?: number } {
    const lock = this.prepare(caller, resource);
    return { key: lockKey(lock.metadata.name), value: JSON.stringify(lock), ...this.ttl(lock) };
  }

  /** A lock as it is stored: one valid target, a name, an expiry in the future; created_at/by set here. */
  private prepare(caller: Identity, lock: LockResource): LockResource {
    const { kind, value } = targetOf(lock.spec.target);
    if (!LOCK_NAME.test(lock.metadata.name)) {
      throw new GatewayError('GW_ERR_RESOURCE_INVALID', `"${lock.metadata.name}" is not a valid lock name`, { hint: 'Lock names are 1-128 letters, digits, ".", "_" or "-".' });
    }
    if (lock.spec.expires !== undefined && !(Date.parse(lock.spec.expires) > this.deps.clock())) {
      throw new GatewayError('GW_ERR_RESOURCE_INVALID', `lock "${lock.metadata.name}": its expiry ${lock.spec.expires} is not in the future`);
    }
    const message = lock.spec.message?.slice(0, MAX_MESSAGE);
    return {
      kind: 'lock',
      version: 'v2',
      metadata: { ...lock.metadata },
      spec: {
        target: { [kind]: value },
        ...(message ? { message } : {}),
        ...(lock.spec.expires === undefined ? {} : { expires: new Date(Date.parse(lock.spec.expires)).toISOString() }),
        created_at: new Date(this.deps.clock()).toISOString(),
        created_by: caller.kind === 'admin' ? 'admin' : caller.name,
      },
    };
  }

  /** The Backend TTL of a lock: its expiry, so that an expired lock is invisible to every reader at once. */
  private ttl(lock: LockResource): { ttlMs?: number } {
    return lock.spec.expires === undefined ? {} : { ttlMs: Math.max(1, Date.parse(lock.spec.expires) - this.deps.clock()) };
  }
}
