/**
 * Identity connectors → gateway roles. Each connector maps what the identity provider says about a user (GitHub
 * teams, SAML attributes, OIDC claims) to role names. A mapping's values match exactly, as a glob with `*`, or as
 * a regular expression when written `^...$` (see match.ts). The result holds each role once, in the order the
 * mappings (and, within one mapping, its roles) are written; a user that no mapping matches gets no role.
 */
import { matchValue } from './match.js';
import type { GithubConnector, OidcConnector, SamlConnector } from './types.js';

function collect(into: string[], roles: readonly string[]): void {
  for (const role of roles) if (!into.includes(role)) into.push(role);
}

/** Roles for a GitHub user who belongs to teams (organization and team slugs, as GitHub reports them). */
export function githubRoles(connector: GithubConnector, teams: ReadonlyArray<{ organization: string; team: string }>): string[] {
  const roles: string[] = [];
  for (const m of connector.spec.teams_to_roles) {
    if (teams.some((t) => matchValue(m.organization, t.organization) && matchValue(m.team, t.team))) collect(roles, m.roles);
  }
  return roles;
}

/** Roles for a SAML assertion whose attributes are name → values (the attribute name matches exactly). */
export function samlRoles(connector: SamlConnector, attributes: Readonly<Record<string, readonly string[]>>): string[] {
  const roles: string[] = [];
  for (const m of connector.spec.attributes_to_roles) {
    const values = Object.hasOwn(attributes, m.name) ? attributes[m.name] : undefined;
    if (Array.isArray(values) && values.some((v) => typeof v === 'string' && matchValue(m.value, v))) collect(roles, m.roles);
  }
  return roles;
}

/**
 * Roles for OIDC claims (the ID token's or the userinfo endpoint's). A claim value may be a string or a list of
 * strings (groups); values of other types (numbers, objects) never match.
 */
export function oidcRoles(connector: OidcConnector, claims: Readonly<Record<string, unknown>>): string[] {
  const roles: string[] = [];
  for (const m of connector.spec.claims_to_roles) {
    const raw = Object.hasOwn(claims, m.claim) ? claims[m.claim] : undefined;
    const values = typeof raw === 'string' ? [raw] : Array.isArray(raw) ? raw.filter((v): v is string => typeof v === 'string') : [];
    if (values.some((v) => matchValue(m.value, v))) collect(roles, m.roles);
  }
  return roles;
}
