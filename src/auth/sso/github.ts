/**
 * The code-hosting OAuth connector (kind github): the OAuth 2.0 authorization code flow with our state (and
 * PKCE, which the service accepts and ignores where it does not support it), then the user and the teams it is
 * in from the REST API. endpoint_url / api_endpoint_url point at a self-hosted instance (defaults: github.com and
 * api.github.com). Teams are read a page at a time, at most MAX_TEAM_PAGES pages.
 */
import { createHash } from 'node:crypto';
import type { GithubConnector } from '../resources/index.js';
import { randomSecret } from '../../wire/secrets.js';
import { getJson, idpAnswered, type IdpFetch } from './fetch.js';
import { tokenInvalid, type IdpIdentity } from './checks.js';

const DEFAULT_ENDPOINT = 'https://github.com';
const DEFAULT_API = 'https://api.github.com';
const PER_PAGE = 100;
const MAX_TEAM_PAGES = 10;

const base = (url: string | undefined, def: string) => (url ?? def).replace(/\/+$/, '');

export interface GithubStart {
  url: string;
  verifier: string;
}

export class GithubFlows {
  constructor(private readonly fetchFor: (ca: string | undefined) => IdpFetch) {}

  start(connector: GithubConnector, state: string): GithubStart {
    const { spec } = connector;
    const verifier = randomSecret();
    const url = new URL(`${base(spec.endpoint_url, DEFAULT_ENDPOINT)}/login/oauth/authorize`);
    url.searchParams.set('client_id', spec.client_id);
    url.searchParams.set('redirect_uri', spec.redirect_url);
    url.searchParams.set('scope', 'read:org');
    url.searchParams.set('state', state);
    url.searchParams.set('code_challenge', createHash('sha256').update(verifier).digest('base64url'));
    url.searchParams.set('code_challenge_method', 'S256');
    return { url: url.href, verifier };
  }

  async finish(connector: GithubConnector, query: URLSearchParams, verifier: string): Promise<IdpIdentity> {
    const { spec } = connector;
    const endpoint = base(spec.endpoint_url, DEFAULT_ENDPOINT);
    const error = query.get('error');
    if (error) throw idpAnswered(endpoint, `the error ${error}${query.get('error_description') ? ` (${query.get('error_description')})` : ''}`);
    const code = query.get('code');
    if (!code) throw tokenInvalid('code', 'the callback carries no authorization code');
    const fetch = this.fetchFor(spec.ca);
    const tokenUrl = `${endpoint}/login/oauth/access_token`;
    const res = await fetch(tokenUrl, {
      method: 'POST',
      headers: { accept: 'application/json', 'content-type': 'application/x-www-form-urlencoded' },
      body: new URLSearchParams({ client_id: spec.client_id, client_secret: spec.client_secret ?? '', code, redirect_uri: spec.redirect_url, code_verifier: verifier }),
    });
    let answer: { access_token?: unknown; error?: unknown; error_description?: unknown };
    try {
      answer = (await res.json()) as typeof answer;
    } catch {
      throw idpAnswered(tokenUrl, `HTTP ${res.status} that is not JSON`);
    }
    if (typeof answer.error === 'string') throw idpAnswered(tokenUrl, `the error ${answer.error}${typeof answer.error_description === 'string' ? ` (${answer.error_description})` : ''}`);
    if (res.status !== 200 || typeof answer.access_token !== 'string') throw idpAnswered(tokenUrl, `HTTP ${res.status} without an access token`);
    const api = base(spec.api_endpoint_url, DEFAULT_API);
    const headers = { authorization: `Bearer ${answer.access_token}`, 'x-github-api-version': '2022-11-28' };
    const user = (await getJson(fetch, `${api}/user`, headers)) as { login?: unknown };
    if (typeof user.login !== 'string' || user.login === '') throw idpAnswered(`${api}/user`, 'a user without a login');
    const teams: Array<{ organization: string; team: string }> = [];
    for (let page = 1; page <= MAX_TEAM_PAGES; page++) {
      const list = await getJson(fetch, `${api}/user/teams?per_page=${PER_PAGE}&page=${page}`, headers);
      if (!Array.isArray(list)) throw idpAnswered(`${api}/user/teams`, 'something that is not a list of teams');
      for (const t of list as Array<{ slug?: unknown; organization?: { login?: unknown } }>) {
        if (typeof t?.slug === 'string' && typeof t.organization?.login === 'string') teams.push({ organization: t.organization.login, team: t.slug });
      }
      if (list.length < PER_PAGE) break;
    }
    return { username: user.login, claims: { login: user.login, teams } };
  }
}
