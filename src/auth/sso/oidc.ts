/**
 * OpenID Connect: the authorization code flow with PKCE (S256), a nonce and our state, through openid-client 6.
 * openid-client checks the ID token (signature against the provider's JWKS, issuer, audience, nonce, expiry, ...);
 * each failed check becomes GW_ERR_SSO_TOKEN_INVALID naming the check. The provider's discovery document is
 * read through the Dialer and kept a few minutes per connector.
 */
import * as client from 'openid-client';
import { GatewayError, isGatewayError } from '../../errors.js';
import type { OidcConnector } from '../resources/index.js';
import { tokenInvalid, type IdpIdentity } from './checks.js';
import { idpAnswered, type IdpFetch } from './fetch.js';
import { sha256hex } from '../../wire/secrets.js';

/** How long a provider's discovery document (and its keys' cache) is reused. */
const DISCOVERY_TTL_MS = 5 * 60_000;
const MAX_CONFIGS = 256;

export interface OidcStart {
  url: string;
  verifier: string;
  nonce: string;
}

/** openid-client's (oauth4webapi's) error → which check failed. */
function checkOf(err: { code?: string; message: string; cause?: unknown }): string | undefined {
  const claim = (err.cause as { claim?: string } | undefined)?.claim;
  switch (err.code) {
    case 'OAUTH_JWT_CLAIM_COMPARISON_FAILED':
      return ({ aud: 'audience', iss: 'issuer', nonce: 'nonce', azp: 'audience' } as Record<string, string>)[claim ?? ''] ?? claim ?? 'claims';
    case 'OAUTH_JWT_TIMESTAMP_CHECK_FAILED':
      return claim === 'exp' ? 'expired' : claim === 'nbf' ? 'not_before' : claim === 'iat' ? 'issued_at' : 'time';
    case 'OAUTH_KEY_SELECTION_FAILED':
      return 'signature';
    case 'OAUTH_INVALID_RESPONSE':
      if (/signature/i.test(err.message)) return 'signature';
      if (/state/i.test(err.message)) return 'state';
      if (/nonce/i.test(err.message)) return 'nonce';
      return 'response';
    case 'OAUTH_JSON_ATTRIBUTE_COMPARISON_FAILED':
      return claim === 'issuer' ? 'issuer' : (claim ?? 'response');
    default:
      return undefined;
  }
}

/**
 * openid-client wraps oauth4webapi's errors in its own (a generic message, the original as cause): the innermost
 * error with a code says which check failed.
 */
function innermost(err: unknown): unknown {
  let e = err as { code?: string; cause?: unknown };
  for (let depth = 0; depth < 4; depth++) {
    const inner = e?.cause as { code?: string; message?: unknown } | undefined;
    if (!inner || typeof inner !== 'object' || typeof inner.message !== 'string' || typeof inner.code !== 'string') break;
    e = inner;
  }
  return e;
}

/** Any failure of openid-client as a GatewayError. */
export function oidcError(issuer: string, outer: unknown): GatewayError {
  if (isGatewayError(outer)) return outer;
  const err = innermost(outer);
  const e = err as { code?: string; message: string; cause?: unknown; error?: string; error_description?: string; name?: string };
  if (e.name === 'AuthorizationResponseError' || e.name === 'ResponseBodyError') {
    return idpAnswered(issuer, `the error ${e.error ?? 'unknown'}${e.error_description ? ` (${e.error_description})` : ''}`);
  }
  if (e.name === 'WWWAuthenticateChallengeError') return idpAnswered(issuer, `an authentication challenge: ${e.message}`);
  const check = checkOf(e);
  if (check) return tokenInvalid(check, e.message);
  if (e.code === 'OAUTH_RESPONSE_IS_NOT_CONFORM' || e.code === 'OAUTH_RESPONSE_IS_NOT_JSON' || e.code === 'OAUTH_PARSE_ERROR') {
    return idpAnswered(issuer, `something that is not a valid OpenID Connect answer: ${e.message}`);
  }
  return new GatewayError('GW_ERR_SSO_IDP_ERROR', `OpenID Connect with ${issuer} failed: ${e.message}`, { cause: err });
}

export class OidcFlows {
  private readonly configs = new Map<string, { config: client.Configuration; at: number }>();

  constructor(
    private readonly fetchFor: (ca: string | undefined) => IdpFetch,
    private readonly clock: () => number,
  ) {}

  private async config(connector: OidcConnector): Promise<client.Configuration> {
    const { spec } = connector;
    const key = sha256hex(JSON.stringify([connector.metadata.name, spec.issuer_url, spec.client_id, spec.client_secret, spec.ca ?? '']));
    const cached = this.configs.get(key);
    if (cached && this.clock() - cached.at < DISCOVERY_TTL_MS) return cached.config;
    const fetch = this.fetchFor(spec.ca);
    let config: client.Configuration;
    try {
      config = await client.discovery(new URL(spec.issuer_url), spec.client_id, { client_secret: spec.client_secret ?? '' }, client.ClientSecretBasic(spec.client_secret ?? ''), {
        [client.customFetch]: fetch as client.CustomFetch,
        timeout: 15,
      });
    } catch (err) {
      throw oidcError(spec.issuer_url, err);
    }
    // The code flow's ID token comes over TLS from the token endpoint, which OIDC lets clients trust without checking
    // its signature; we check it anyway (a compromised or spoofed endpoint must not mint identities).
    client.enableNonRepudiationChecks(config);
    this.configs.set(key, { config, at: this.clock() });
    while (this.configs.size > MAX_CONFIGS) this.configs.delete(this.configs.keys().next().value!);
    return config;
  }

  /** Forgets a connector's discovery document (after a failure: the provider may have rotated its keys). */
  forget(): void {
    this.configs.clear();
  }

  async start(connector: OidcConnector, state: string): Promise<OidcStart> {
    const config = await this.config(connector);
    const verifier = client.randomPKCECodeVerifier();
    const nonce = client.randomNonce();
    const scopes = ['openid', ...(connector.spec.scope ?? ['email', 'profile']).filter((s) => s !== 'openid')];
    const url = client.buildAuthorizationUrl(config, {
      redirect_uri: connector.spec.redirect_url,
      scope: scopes.join(' '),
      code_challenge: await client.calculatePKCECodeChallenge(verifier),
      code_challenge_method: 'S256',
      state,
      nonce,
    });
    return { url: url.href, verifier, nonce };
  }

  /**
   * The callback's query → the user. The code is exchanged (with the PKCE verifier) and the ID token checked; the
   * userinfo endpoint's claims complete the ID token's (which win when both have a claim).
   */
  async finish(connector: OidcConnector, query: URLSearchParams, checks: { state: string; verifier: string; nonce: string }): Promise<IdpIdentity> {
    const { spec } = connector;
    const config = await this.config(connector);
    const current = new URL(spec.redirect_url);
    current.search = query.toString();
    let claims: Record<string, unknown>;
    try {
      const tokens = await client.authorizationCodeGrant(config, current, {
        pkceCodeVerifier: checks.verifier,
        expectedState: checks.state,
        expectedNonce: checks.nonce,
        idTokenExpected: true,
      });
      const idClaims = tokens.claims();
      if (!idClaims) throw tokenInvalid('id_token', 'the token endpoint answered no ID token');
      let info: Record<string, unknown> = {};
      if (config.serverMetadata().userinfo_endpoint) info = await client.fetchUserInfo(config, tokens.access_token, idClaims.sub);
      claims = { ...info, ...idClaims };
    } catch (err) {
      const e = oidcError(spec.issuer_url, err);
      if (e.code === 'GW_ERR_SSO_TOKEN_INVALID') this.forget();
      throw e;
    }
    return { username: usernameOf(claims, spec), claims };
  }
}

/** Values of email_verified that say the provider verified the address (some providers send the string). */
const VERIFIED = new Set<unknown>([true, 'true']);

/**
 * Who signed in. By default a verified e-mail address names the user: the `email` claim, and `email_verified` true
 * (absent counts as not verified unless the connector sets allow_unverified_email). username_claim opts in to
 * another claim (e.g. preferred_username), taken as the provider sends it; there is no fallback to another claim.
 */
export function usernameOf(claims: Record<string, unknown>, spec: Pick<OidcConnector['spec'], 'username_claim' | 'allow_unverified_email'>): string {
  const claim = spec.username_claim ?? 'email';
  const v = claims[claim];
  if (typeof v !== 'string' || v === '') {
    throw usernameRefused(claim, `the ID token and userinfo carry no ${claim} claim to name the user`, claim === 'email'
      ? "Ask the provider for the email scope (the connector's scope), or set the connector's username_claim to a claim the provider sends (e.g. preferred_username)."
      : `Set the connector's username_claim to a claim the provider sends, or ask the provider for the scope that carries ${claim}.`);
  }
  // An address the provider does not say it verified names nobody: anyone could have typed it.
  if (claim === 'email' && !VERIFIED.has(claims.email_verified) && spec.allow_unverified_email !== true) {
    const said = claims.email_verified === undefined ? 'sends no email_verified claim for' : `says email_verified: ${JSON.stringify(claims.email_verified)} for`;
    throw usernameRefused('email_verified', `the provider ${said} the e-mail address ${v.slice(0, 256)}`, "Verify the address at the identity provider. If the provider never sends the email_verified claim and checks addresses itself, set the connector's allow_unverified_email: true; or set username_claim to another claim.");
  }
  return v;
}

function usernameRefused(claim: string, detail: string, hint: string): GatewayError {
  return new GatewayError('GW_ERR_SSO_USERNAME_REFUSED', `the identity provider's answer names no user this connector accepts: ${detail}`, { hint, details: { claim } });
}
