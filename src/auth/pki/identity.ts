/**
 * The Identity a certificate carries, its validation and its encoding as the X.509 identity extension.
 */
import { GatewayError } from '../../errors.js';
import type { DatabaseGrant } from '../../tunnel/protocol.js';

export interface Identity {
  /** admin = the Auth Service's local admin identity (full permissions). */
  kind: 'user' | 'host' | 'admin';
  /** Username, or host ID (uuid). */
  name: string;
  cluster: string;
  /** user: role names; host: system roles such as node, db, app, kube, desktop, proxy. */
  roles: string[];
  /** Hosts. */
  nodename?: string;
  /** Users: OS logins allowed, computed at issue time. */
  logins?: string[];
  /**
   * When the certificate that carries this identity was issued (ms since the epoch), as the server that checked
   * it read it; never part of the certificate's identity extension. Lets the Auth Service refuse a certificate
   * older than the user it names (a user removed and created again under the same name).
   */
  issuedAt?: number;
  /**
   * Users, as resolved (resolveCaller), never in a certificate: the database users and names the current roles
   * and the stored traits allow (rbac.ts databaseGrant); the Proxy carries it to the agent serving a database.
   */
  db?: DatabaseGrant;
  /**
   * Users, as resolved, never in a certificate: the Kubernetes users and groups the current roles and the stored
   * traits allow (rbac.ts kubeGrant); the Proxy impersonates from them (rbac.ts kubeImpersonation).
   */
  kube?: KubeGrant;
}

/** Kubernetes users and groups a user may act as: allowed minus denied, templates expanded. */
export interface KubeGrant {
  users: string[];
  groups: string[];
}

/** OID of the identity extension, and the one it had before (read only): src/wire/certs.ts, docs/pki.md. */
export { IDENTITY_EXTENSION_OID, LEGACY_IDENTITY_EXTENSION_OID } from '../../wire/certs.js';

export const IDENTITY_KINDS = ['user', 'host', 'admin'] as const;

/** Longest string accepted in any identity field, in UTF-16 code units. */
export const MAX_IDENTITY_STRING = 1024;
/** Largest encoded identity (compact JSON, UTF-8 bytes). */
export const MAX_IDENTITY_JSON = 32 * 1024;

const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** Why `s` is not acceptable as an identity string, or undefined when it is. */
export function badIdentityString(s: unknown): string | undefined {
  if (typeof s !== 'string') return 'is not a string';
  if (s.length === 0) return 'is empty';
  if (s.length > MAX_IDENTITY_STRING) return `is longer than ${MAX_IDENTITY_STRING} characters`;
  if (CONTROL.test(s)) return 'contains a control character';
  if (LONE_SURROGATE.test(s)) return 'is not well-formed Unicode';
  return undefined;
}

/**
 * Checks an Identity and returns a canonical copy (known fields only, in a fixed order). `fail` builds the
 * error for a reason: GW_ERR_PKI_BAD_REQUEST when issuing, GW_ERR_AUTH_BAD_CERT when reading a certificate.
 */
export function canonicalIdentity(value: unknown, fail: (reason: string) => GatewayError): Identity {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw fail('identity is not an object');
  const v = value as Record<string, unknown>;
  if (!IDENTITY_KINDS.includes(v.kind as Identity['kind'])) {
    throw fail(`identity kind must be one of ${IDENTITY_KINDS.join(', ')}`);
  }
  const str = (field: string): string => {
    const why = badIdentityString(v[field]);
    if (why) throw fail(`identity ${field} ${why}`);
    return v[field] as string;
  };
  const list = (field: string): string[] => {
    const l = v[field];
    if (!Array.isArray(l)) throw fail(`identity ${field} is not a list`);
    if (l.length > MAX_IDENTITY_STRING) throw fail(`identity ${field} has more than ${MAX_IDENTITY_STRING} entries`);
    return l.map((item, i) => {
      const why = badIdentityString(item);
      if (why) throw fail(`identity ${field}[${i}] ${why}`);
      return item as string;
    });
  };
  const out: Identity = {
    kind: v.kind as Identity['kind'],
    name: str('name'),
    cluster: str('cluster'),
    roles: list('roles'),
  };
  if (v.nodename !== undefined) out.nodename = str('nodename');
  if (v.logins !== undefined) out.logins = list('logins');
  return out;
}

/** Compact JSON of the canonical identity (the content of the identity extension's UTF8String). */
export function encodeIdentity(identity: Identity, fail: (reason: string) => GatewayError): string {
  const json = JSON.stringify(canonicalIdentity(identity, fail));
  if (Buffer.byteLength(json, 'utf8') > MAX_IDENTITY_JSON) throw fail(`identity is larger than ${MAX_IDENTITY_JSON} bytes`);
  return json;
}

export function decodeIdentity(json: string, fail: (reason: string) => GatewayError): Identity {
  let parsed: unknown;
  try {
    parsed = JSON.parse(json);
  } catch {
    throw fail('the identity extension is not JSON');
  }
  return canonicalIdentity(parsed, fail);
}
