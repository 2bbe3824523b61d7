/**
 * Sign-in requests in flight: what a single sign-on started (the connector, the PKCE verifier, the nonce, the SAML
 * request ID, where to go afterwards, or the console client's keys) kept in the Backend for 10 minutes under a
 * hash of its state, and taken exactly once by the callback: a replayed callback finds nothing. The console's
 * one-time codes are kept the same way. Keys hold hashes only: a state or code in a key would be a secret in logs.
 */
import type { Backend } from '../../backend/index.js';
import { GatewayError } from '../../errors.js';
import { sameSecret, sha256hex } from '../../wire/secrets.js';

/** How long a sign-in may take at the identity provider. */
export const SSO_REQUEST_TTL_MS = 10 * 60_000;
/** How long gwsh has to exchange the one-time code its callback received. */
export const SSO_CODE_TTL_MS = 2 * 60_000;

export type SsoKind = 'oidc' | 'saml' | 'github';
export const SSO_KINDS: readonly SsoKind[] = ['oidc', 'saml', 'github'];

/** What gwsh login --auth sends: its keys, its loopback callback and the hash of the secret it keeps. */
export interface ConsoleRequest {
  publicKeyPem: string;
  sshPublicKey: string;
  redirectUrl: string;
  secretHash: string;
  /** The console's request ID (what it exchanges the code with); its hash is the code record's key. */
  requestId: string;
}

export interface SsoRequest {
  kind: SsoKind;
  connector: string;
  mode: 'web' | 'console';
  /** web: the same-origin path to go to after sign-in. */
  redirect?: string;
  /** web: sha256 of the value of the browser-binding cookie set when the sign-in started. */
  browserHash?: string;
  /** OIDC: the PKCE code verifier and the nonce. */
  verifier?: string;
  nonce?: string;
  /** SAML: the ID of our AuthnRequest (the response's InResponseTo must name it). */
  samlRequestId?: string;
  console?: ConsoleRequest;
  source: string;
  createdAt: number;
}

/** What a console callback leaves for the exchange: who signed in, for the console's keys. */
export interface ConsoleGrant {
  codeHash: string;
  secretHash: string;
  user: string;
  console: ConsoleRequest;
  connector: { kind: SsoKind; name: string };
}

const KEY = {
  request: (state: string) => `/sso/requests/${sha256hex(state)}`,
  grant: (requestId: string) => `/sso/console/${sha256hex(requestId)}`,
};

/** Longest state, code or request ID read from a client: ours are 43 characters. */
const MAX_ID = 128;

function stateInvalid(why: string): GatewayError {
  return new GatewayError('GW_ERR_SSO_STATE_INVALID', `this sign-in request is not valid: ${why}`);
}

export class SsoRequests {
  constructor(private readonly backend: Backend) {}

  /** Stores a new request under its state (randomSecret(): the value the identity provider hands back). */
  async saveAs(state: string, request: SsoRequest): Promise<void> {
    await this.backend.create(KEY.request(state), JSON.stringify(request), { ttlMs: SSO_REQUEST_TTL_MS });
  }

  /**
   * The request of state, deleted in the same step: unknown, expired or already taken → GW_ERR_SSO_STATE_INVALID.
   * Two callbacks racing with one state: the Backend's delete succeeds for one of them only.
   */
  async take(state: string | undefined | null): Promise<SsoRequest> {
    if (!state) throw stateInvalid('the callback carries no state');
    if (state.length > MAX_ID) throw stateInvalid('the state is too long');
    const key = KEY.request(state);
    const item = await this.backend.get(key);
    if (!item || !(await this.backend.delete(key))) throw stateInvalid('unknown, expired (10 minutes) or already used');
    return JSON.parse(item.value) as SsoRequest;
  }

  async saveGrant(grant: ConsoleGrant): Promise<void> {
    await this.backend.put(KEY.grant(grant.console.requestId), JSON.stringify(grant), { ttlMs: SSO_CODE_TTL_MS });
  }

  /** The console's grant: taken once, whatever the outcome; the code and the secret must both match. */
  async takeGrant(requestId: string, code: string, secret: string): Promise<ConsoleGrant> {
    if (requestId.length > MAX_ID || code.length > MAX_ID || secret.length > MAX_ID) throw stateInvalid('a field is too long');
    const key = KEY.grant(requestId);
    const item = await this.backend.get(key);
    if (!item || !(await this.backend.delete(key))) throw stateInvalid('no sign-in finished for this request, or its code was used or expired');
    const grant = JSON.parse(item.value) as ConsoleGrant;
    if (!sameSecret(code, grant.codeHash) || !sameSecret(secret, grant.secretHash)) throw stateInvalid('the code or the secret does not match');
    return grant;
  }
}
