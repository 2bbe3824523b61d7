/**
 * Users that single sign-on vouched for: stored like local users (/users/<name>, no password) with the roles the
 * connector's mapping gave, the identity provider's claims as traits, `created_by` naming the connector, and an
 * expiry at the end of the session (metadata.expires and the record's TTL). So locks, `gwctl users rm` and
 * resolveCaller work by name as for local users, and the record goes away by itself when nobody signed in lately.
 * A local user (one without created_by) of the same name is never replaced, nor is the user of another connector.
 */
import type { Backend } from '../../backend/index.js';
import { GatewayError } from '../../errors.js';
import { KEYS, NAME_PATTERN, type StoredUser } from '../records.js';
import type { Traits, UserResource } from '../resources/index.js';
import type { SsoKind } from './requests.js';
import { tokenInvalid } from './checks.js';

/** Bounds of what is kept of the identity provider's claims as traits. */
const MAX_TRAITS = 64;
const MAX_VALUES = 256;
const MAX_VALUE_LENGTH = 512;
const TRAIT_NAME = /^[A-Za-z0-9_.:/-]{1,128}$/;

/** String and string-list claims (attributes, teams as org/team) as traits, bounded. */
export function traitsOf(claims: Record<string, unknown>): Traits {
  const traits: Traits = {};
  for (const [name, raw] of Object.entries(claims)) {
    if (Object.keys(traits).length >= MAX_TRAITS) break;
    if (!TRAIT_NAME.test(name)) continue;
    const values = (Array.isArray(raw) ? raw : [raw]).filter((v): v is string => typeof v === 'string' && v.length <= MAX_VALUE_LENGTH).slice(0, MAX_VALUES);
    if (values.length > 0) traits[name] = values;
  }
  return traits;
}

export interface SsoUser {
  name: string;
  roles: string[];
  traits: Traits;
  kind: SsoKind;
  connector: string;
}

/** Writes (or refreshes) the user record for a session ending at expiresAt. */
export async function saveSsoUser(backend: Backend, now: number, user: SsoUser, expiresAt: number): Promise<void> {
  if (!NAME_PATTERN.test(user.name)) {
    throw tokenInvalid('username', `"${user.name.slice(0, 140)}" is not a valid user name here (1-128 letters, digits, ".", "_", "@" or "-")`, "Set the connector's username_claim (OIDC) to a claim whose values are such names, or map NameIDs / logins that are.");
  }
  const key = KEYS.user(user.name);
  const existing = await backend.get(key);
  const stored = existing ? (JSON.parse(existing.value) as StoredUser) : undefined;
  if (stored && !stored.resource.spec.created_by) {
    throw new GatewayError('GW_ERR_ACCESS_DENIED', `a local user named "${user.name}" exists: single sign-on does not sign in as a local user`, {
      hint: 'Sign in with that local user\'s password, or remove the local user (gwctl users rm) if the identity provider should own the name.',
    });
  }
  // Names are the identity provider's: "alice" at one provider is not "alice" at another (a public code-hosting
  // service lets anyone pick a login). The record (its roles, traits, and the certificates a console exchange
  // issues from it) stays its connector's until it expires or is removed.
  const owner = stored?.resource.spec.created_by;
  if (owner && (owner.connector !== user.connector || owner.kind !== user.kind)) {
    throw new GatewayError('GW_ERR_ACCESS_DENIED', `user "${user.name}" belongs to the ${owner.kind} connector "${owner.connector}": the ${user.kind} connector "${user.connector}" cannot sign in as it`, {
      hint: `Sign in through the ${owner.kind} connector "${owner.connector}", or remove the user (gwctl users rm ${user.name}) if this connector should own the name.`,
    });
  }
  const until = Math.max(expiresAt, existing?.expiresAt ?? 0);
  const resource: UserResource = {
    kind: 'user',
    version: 'v2',
    metadata: { name: user.name, expires: new Date(until).toISOString() },
    spec: { roles: user.roles, traits: user.traits, created_by: { connector: user.connector, kind: user.kind, time: new Date(now).toISOString() } },
  };
  const record: StoredUser = { resource, createdAt: stored?.createdAt ?? new Date(now).toISOString() };
  // Written only over what was read: a local user created meanwhile (or a concurrent sign-in) makes this fail
  // closed with GW_ERR_BACKEND_CONFLICT rather than be overwritten.
  const condition = existing ? { key, revision: existing.revision } : { key, exists: false as const };
  await backend.atomicWrite([condition], [{ type: 'put', key, value: JSON.stringify(record), ttlMs: Math.max(1000, until - now) }]);
}
