/**
 * SAML 2.0, SP-initiated: an AuthnRequest by the HTTP-Redirect binding (its ID kept with the sign-in request, our
 * state as RelayState), and the response POSTed to the ACS checked by @node-saml/node-saml: the response or its
 * assertion signed by a certificate of the identity provider's metadata, the audience (our entity ID), the
 * assertion's time window (NotBefore / NotOnOrAfter), and InResponseTo naming the very request we stored (an
 * unsolicited response is refused). The assertion's issuer must be the metadata's entity ID. Each failed check is
 * GW_ERR_SSO_TOKEN_INVALID naming it.
 */
import { DOMParser } from '@xmldom/xmldom';
import { SAML, ValidateInResponseTo, type CacheProvider, type Profile } from '@node-saml/node-saml';
import { GatewayError, isGatewayError } from '../../errors.js';
import type { SamlConnector } from '../resources/index.js';
import { getText, type IdpFetch } from './fetch.js';
import { tokenInvalid, type IdpIdentity } from './checks.js';

const MD = 'urn:oasis:names:tc:SAML:2.0:metadata';
const DS = 'http://www.w3.org/2000/09/xmldsig#';
const REDIRECT_BINDING = 'urn:oasis:names:tc:SAML:2.0:bindings:HTTP-Redirect';
const METADATA_TTL_MS = 5 * 60_000;
/** Clock difference tolerated between us and the identity provider for the assertion's time window. */
const CLOCK_SKEW_MS = 60_000;

/** What we use of the identity provider's metadata. */
export interface IdpMetadata {
  entityId: string;
  ssoUrl: string;
  certs: string[];
}

function metadataInvalid(why: string): GatewayError {
  return new GatewayError('GW_ERR_SSO_IDP_ERROR', `the SAML identity provider's metadata is not usable: ${why}`, {
    hint: "Put the provider's metadata XML (EntityDescriptor with an IDPSSODescriptor, an HTTP-Redirect SingleSignOnService and a signing certificate) in entity_descriptor, or its URL in entity_descriptor_url.",
  });
}

/** Reads entity ID, HTTP-Redirect sign-on URL and signing certificates from metadata XML. */
export function parseIdpMetadata(xml: string): IdpMetadata {
  let problem: string | undefined;
  const doc = new DOMParser({ errorHandler: (level: string, msg: unknown) => void (level !== 'warning' && (problem ??= String(msg))) }).parseFromString(xml, 'text/xml');
  if (problem || !doc?.documentElement) throw metadataInvalid(`not well-formed XML (${problem ?? 'empty'})`);
  const entities = Array.from(doc.getElementsByTagNameNS(MD, 'EntityDescriptor'));
  const entity = entities.find((e) => e.getElementsByTagNameNS(MD, 'IDPSSODescriptor').length > 0);
  if (!entity) throw metadataInvalid('no EntityDescriptor with an IDPSSODescriptor');
  const entityId = entity.getAttribute('entityID') ?? '';
  if (!entityId) throw metadataInvalid('the EntityDescriptor has no entityID');
  const idp = entity.getElementsByTagNameNS(MD, 'IDPSSODescriptor')[0]!;
  const sso = Array.from(idp.getElementsByTagNameNS(MD, 'SingleSignOnService')).find((s) => s.getAttribute('Binding') === REDIRECT_BINDING);
  const ssoUrl = sso?.getAttribute('Location') ?? '';
  if (!ssoUrl) throw metadataInvalid('no SingleSignOnService with the HTTP-Redirect binding');
  const certs: string[] = [];
  for (const kd of Array.from(idp.getElementsByTagNameNS(MD, 'KeyDescriptor'))) {
    const use = kd.getAttribute('use');
    if (use && use !== 'signing') continue;
    for (const c of Array.from(kd.getElementsByTagNameNS(DS, 'X509Certificate'))) {
      const b64 = (c.textContent ?? '').replace(/\s+/g, '');
      if (b64) certs.push(`-----BEGIN CERTIFICATE-----\n${b64.match(/.{1,64}/g)!.join('\n')}\n-----END CERTIFICATE-----\n`);
    }
  }
  if (certs.length === 0) throw metadataInvalid('no signing certificate (KeyDescriptor with an X509Certificate)');
  return { entityId, ssoUrl, certs };
}

/** node-saml's error (a plain Error with a message) → which check failed. */
function samlCheck(message: string): string {
  if (/InResponseTo/i.test(message)) return 'in_response_to';
  if (/signature|Cannot obtain assertion/i.test(message)) return 'signature';
  if (/audience/i.test(message)) return 'audience';
  if (/expired|too old/i.test(message)) return 'expired';
  if (/not yet valid/i.test(message)) return 'not_before';
  // node-saml picks a SubjectConfirmation by its time window only: none found means every one is out of its window.
  if (/subject confirmation/i.test(message)) return 'expired';
  if (/issuer/i.test(message)) return 'issuer';
  if (/assertion/i.test(message)) return 'assertion';
  return 'response';
}

export function samlError(err: unknown): GatewayError {
  if (isGatewayError(err)) return err;
  const e = err as Error;
  if (e.name === 'SamlStatusError' || /SAML provider returned/.test(e.message)) {
    return new GatewayError('GW_ERR_SSO_IDP_ERROR', `the SAML identity provider refused the sign-in: ${e.message}`, {
      hint: "Check the identity provider's logs: the user may not be assigned to this application.",
    });
  }
  return tokenInvalid(samlCheck(e.message), e.message);
}

/** A cache that knows exactly one request ID: InResponseTo must name it. */
function oneRequest(requestId: string, createdAt: number): CacheProvider {
  let known: string | null = requestId;
  return {
    saveAsync: async () => null,
    getAsync: async (key) => (key === known ? new Date(createdAt).toISOString() : null),
    removeAsync: async (key) => {
      if (key === known) known = null;
      return key;
    },
  };
}

export class SamlFlows {
  private readonly metadata = new Map<string, { value: IdpMetadata; at: number }>();

  constructor(
    private readonly fetchFor: (ca: string | undefined) => IdpFetch,
    private readonly clock: () => number,
  ) {}

  async idp(connector: SamlConnector): Promise<IdpMetadata> {
    const { spec } = connector;
    if (spec.entity_descriptor !== undefined) return parseIdpMetadata(spec.entity_descriptor);
    const url = spec.entity_descriptor_url!;
    const cached = this.metadata.get(url);
    if (cached && this.clock() - cached.at < METADATA_TTL_MS) return cached.value;
    const value = parseIdpMetadata(await getText(this.fetchFor(spec.ca), url));
    this.metadata.set(url, { value, at: this.clock() });
    return value;
  }

  private saml(connector: SamlConnector, idp: IdpMetadata, requestId: string, createdAt: number): SAML {
    const { spec } = connector;
    const entityId = spec.service_provider_issuer ?? spec.acs;
    return new SAML({
      entryPoint: idp.ssoUrl,
      issuer: entityId,
      callbackUrl: spec.acs,
      idpCert: idp.certs,
      idpIssuer: idp.entityId,
      audience: entityId,
      wantAssertionsSigned: false,
      wantAuthnResponseSigned: false,
      validateInResponseTo: ValidateInResponseTo.always,
      requestIdExpirationPeriodMs: 10 * 60_000,
      cacheProvider: oneRequest(requestId, createdAt),
      generateUniqueId: () => requestId,
      acceptedClockSkewMs: CLOCK_SKEW_MS,
      identifierFormat: null,
      disableRequestedAuthnContext: true,
      ...(spec.signing_key_pair?.private_key ? { privateKey: spec.signing_key_pair.private_key, signatureAlgorithm: 'sha256' as const } : {}),
    });
  }

  /** The identity provider's URL with our AuthnRequest; requestId is the ID it carries. */
  async start(connector: SamlConnector, state: string, requestId: string): Promise<string> {
    const idp = await this.idp(connector);
    return this.saml(connector, idp, requestId, this.clock()).getAuthorizeUrlAsync(state, undefined, {});
  }

  async finish(connector: SamlConnector, samlResponse: string, request: { requestId: string; createdAt: number }): Promise<IdpIdentity> {
    const idp = await this.idp(connector);
    let profile: Profile | null;
    try {
      ({ profile } = await this.saml(connector, idp, request.requestId, request.createdAt).validatePostResponseAsync({ SAMLResponse: samlResponse }));
    } catch (err) {
      throw samlError(err);
    }
    if (!profile) throw tokenInvalid('assertion', 'the response carries no assertion');
    if (profile.issuer !== idp.entityId) throw tokenInvalid('issuer', `the assertion is issued by "${profile.issuer ?? ''}", not by the provider of the metadata, "${idp.entityId}"`);
    const username = profile.nameID;
    if (!username) throw tokenInvalid('subject', 'the assertion names no user (NameID)');
    const attributes: Record<string, string[]> = {};
    for (const [name, value] of Object.entries((profile.attributes ?? {}) as Record<string, unknown>)) {
      const values = (Array.isArray(value) ? value : [value]).filter((v): v is string => typeof v === 'string');
      if (values.length > 0) attributes[name] = values;
    }
    return { username, claims: attributes };
  }
}
