/** Sign-in: a local user's password, or one button per configured SSO connector. */
import { useEffect, useState } from 'preact/hooks';
import { api, bearer } from '../api.js';
import { ErrorBox, Notice } from '../components/ui.js';
import type { ApiError } from '../lib/errors.js';
import { safeRedirect } from '../lib/route.js';
import type { Connector, Ping } from '../types.js';

const KIND_LABEL: Record<string, string> = { oidc: 'OpenID Connect', saml: 'SAML', github: 'GitHub' };

function ssoHref(c: Connector, redirect: string): string {
  return `/webapi/sso/${encodeURIComponent(c.kind)}/${encodeURIComponent(c.name)}/login?redirect=${encodeURIComponent(redirect)}`;
}

function Connectors({ redirect, preferred }: { redirect: string; preferred: string | undefined }) {
  const [list, setList] = useState<Connector[] | undefined>(undefined);
  const [error, setError] = useState<ApiError | Error | undefined>(undefined);
  const [def, setDef] = useState<string | undefined>(undefined);
  useEffect(() => {
    api.connectors().then(
      (r) => {
        setList(Array.isArray(r.connectors) ? r.connectors : []);
        setDef(r.default);
      },
      // No connector route (404) is a cluster with local users only: nothing to show.
      (e: ApiError) => (e.status === 404 && !e.code.startsWith('GW_ERR_SSO') ? setList([]) : setError(e)),
    );
  }, []);
  if (error) return <ErrorBox error={error} testid="connectors-error" />;
  if (!list || list.length === 0) return null;
  const first = def ?? preferred;
  const sorted = [...list].sort((a, b) => Number(b.name === first) - Number(a.name === first));
  return (
    <div class="connectors" data-testid="connectors">
      {sorted.map((c) => (
        <a key={`${c.kind}/${c.name}`} class={`btn btn-block ${c.name === first ? 'btn-primary' : 'btn-secondary'}`} href={ssoHref(c, redirect)} data-testid={`connector-${c.name}`}>
          Sign in with {c.display || c.name}
          <span class="btn-sub">{KIND_LABEL[c.kind] ?? c.kind}</span>
        </a>
      ))}
      <div class="divider"><span>or with a local user</span></div>
    </div>
  );
}

export function LoginPage({ ping, onSignedIn }: { ping: Ping | undefined; onSignedIn: (to: string) => void }) {
  const params = new URLSearchParams(location.search);
  const redirect = safeRedirect(params.get('redirect'));
  const expired = params.get('expired') === '1';
  const [user, setUser] = useState('');
  const [password, setPassword] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<ApiError | Error | undefined>(undefined);
  useEffect(() => bearer.clear(), []);

  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(undefined);
    try {
      const created = await api.signIn(user.trim(), password);
      bearer.set(created.token);
      setPassword('');
      onSignedIn(redirect);
    } catch (err) {
      setError(err as Error);
      setBusy(false);
    }
  };

  return (
    <div class="login-page">
      <div class="login-card card">
        <div class="login-brand">
          <span class="brand-mark big" aria-hidden="true">G</span>
          <div>
            <h1>Sign in to Gateway</h1>
            <p class="muted" data-testid="login-cluster">{ping ? `Cluster ${ping.cluster_name}` : '\u00a0'}</p>
          </div>
        </div>
        {expired ? <Notice kind="warning" testid="login-message">Your session expired. Sign in again to continue.</Notice> : null}
        <Connectors redirect={redirect} preferred={ping?.auth?.connector?.name} />
        <form onSubmit={submit} class="form" data-testid="login-form">
          <label class="field">
            <span>User name</span>
            <input name="username" autocomplete="username" autofocus required maxLength={256} value={user} onInput={(e) => setUser(e.currentTarget.value)} data-testid="login-user" />
          </label>
          <label class="field">
            <span>Password</span>
            <input name="password" type="password" autocomplete="current-password" required maxLength={4096} value={password} onInput={(e) => setPassword(e.currentTarget.value)} data-testid="login-password" />
          </label>
          <ErrorBox error={error} testid="login-error" />
          <button type="submit" class="btn btn-primary btn-block" disabled={busy} data-testid="login-submit">
            {busy ? 'Signing in…' : 'Sign in'}
          </button>
        </form>
      </div>
      <p class="login-foot muted">{ping ? `Gateway ${ping.server_version}` : ''}</p>
    </div>
  );
}
