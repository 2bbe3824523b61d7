/**
 * What every kind of connector's checks share: the identity a provider vouched for, and the error of a failed
 * check (GW_ERR_SSO_TOKEN_INVALID naming the check). Kept apart from the flows so that importing it loads no
 * OIDC or SAML library.
 */
import { GatewayError } from '../../errors.js';

export interface IdpIdentity {
  username: string;
  /** What the mapping reads: OIDC claims, SAML attributes, or teams. */
  claims: Record<string, unknown>;
}

export function tokenInvalid(check: string, detail: string, hint?: string): GatewayError {
  return new GatewayError('GW_ERR_SSO_TOKEN_INVALID', `the identity provider's answer failed the ${check} check: ${detail}`, {
    hint: hint ?? "Sign in again. If it keeps failing, compare the connector's settings (issuer, client ID, entity IDs, certificate) with the identity provider's, and check both clocks; a forged answer is refused on purpose.",
    details: { check },
  });
}

