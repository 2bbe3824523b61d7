/** The shell: routing, the session, the header and side navigation; pages render inside it. */
import type { ComponentChildren } from 'preact';
import { useCallback, useEffect, useState } from 'preact/hooks';
import { api, bearer, whenSignedOut } from './api.js';
import { ErrorBox, Spinner } from './components/ui.js';
import type { ApiError } from './lib/errors.js';
import { matchRoute, type Page } from './lib/route.js';
import { relative } from './lib/time.js';
import { linkClick, loginHref, navigate, onNavigate } from './nav.js';
import { AgentsPage } from './pages/agents.js';
import { AuditPage } from './pages/audit.js';
import { LaunchPage } from './pages/launch.js';
import { LoginPage } from './pages/login.js';
import { MaintenancePage } from './pages/maintenance.js';
import { ResourcesPage } from './pages/resources.js';
import { SsoCompletePage } from './pages/sso-complete.js';
import { TokensPage } from './pages/tokens.js';
import type { CurrentSession, Ping } from './types.js';

/** xterm.js is most of the bundle: loaded only when a terminal opens (no preact/compat for lazy()). */
type TerminalModule = typeof import('./pages/terminal.js');
let terminalModule: Promise<TerminalModule> | undefined;

function LazyTerminal(props: { node: string; session: CurrentSession }) {
  const [mod, setMod] = useState<TerminalModule | undefined>(undefined);
  const [error, setError] = useState<Error | undefined>(undefined);
  useEffect(() => {
    terminalModule ??= import('./pages/terminal.js');
    terminalModule.then(setMod, (e: Error) => {
      terminalModule = undefined;
      setError(new Error(`the terminal could not be loaded: ${e.message}`));
    });
  }, []);
  if (error) return <ErrorBox error={error} testid="terminal-error" />;
  return mod ? <mod.TerminalPage {...props} /> : <Spinner label="Loading the terminal…" />;
}

const PUBLIC_PAGES: readonly Page[] = ['login', 'sso-complete'];
/** A timer longer than this overflows setTimeout's 32-bit delay. */
const MAX_TIMER = 2 ** 31 - 1;

function here(): string {
  return location.pathname + location.search;
}

/** The session of the page: loaded from GET /webapi/sessions/current when a bearer is kept. */
function useSession(needed: boolean) {
  const [session, setSession] = useState<CurrentSession | undefined>(undefined);
  const [error, setError] = useState<ApiError | Error | undefined>(undefined);
  const load = useCallback(() => {
    setError(undefined);
    api.current().then(setSession, (e: Error) => setError(e));
  }, []);
  useEffect(() => {
    if (!needed || session) return;
    if (!bearer.get()) navigate(loginHref(here()), { replace: true });
    else load();
  }, [needed, session, load]);
  // The session ends at its expiry whatever the page is doing: back to the sign-in page, saying why.
  useEffect(() => {
    if (!session) return;
    const left = Date.parse(session.expires_at) - Date.now();
    if (!Number.isFinite(left)) return;
    const timer = setTimeout(() => {
      bearer.clear();
      setSession(undefined);
      navigate(loginHref(here(), 'expired'), { replace: true });
    }, Math.min(Math.max(left, 0), MAX_TIMER));
    return () => clearTimeout(timer);
  }, [session]);
  return { session, setSession, error, load };
}

export function App() {
  const [, setTick] = useState(0);
  useEffect(() => onNavigate(() => setTick((t) => t + 1)), []);
  const route = matchRoute(location.pathname);
  const needed = !PUBLIC_PAGES.includes(route.page);
  const { session, setSession, error, load } = useSession(needed);
  const [ping, setPing] = useState<Ping | undefined>(undefined);
  useEffect(() => {
    api.ping().then(setPing, () => undefined);
    whenSignedOut((reason) => {
      setSession(undefined);
      navigate(loginHref(here(), reason), { replace: true });
    });
  }, [setSession]);
  const signedIn = useCallback((to: string) => {
    setSession(undefined);
    navigate(to, { replace: true });
  }, [setSession]);

  if (route.page === 'login') return <LoginPage ping={ping} onSignedIn={signedIn} />;
  if (route.page === 'sso-complete') return <SsoCompletePage onSignedIn={signedIn} />;
  if (!session) {
    return (
      <div class="center-page">
        {error ? (
          <div class="card narrow">
            <ErrorBox error={error} testid="session-error" />
            <button type="button" class="btn" onClick={load}>Try again</button>
          </div>
        ) : (
          <Spinner label="Loading your session…" />
        )}
      </div>
    );
  }
  return (
    <Shell session={session} ping={ping} page={route.page}>
      <Body page={route.page} params={route.params} session={session} ping={ping} />
    </Shell>
  );
}

function Body({ page, params, session, ping }: { page: Page; params: Record<string, string>; session: CurrentSession; ping: Ping | undefined }) {
  switch (page) {
    case 'resources':
      return <ResourcesPage session={session} />;
    case 'launch':
      return <LaunchPage />;
    case 'agents':
      return <AgentsPage session={session} />;
    case 'terminal':
      return <LazyTerminal node={params.node ?? ''} session={session} />;
    case 'maintenance':
      return <MaintenancePage session={session} />;
    case 'tokens':
      return <TokensPage session={session} ping={ping} />;
    case 'audit':
      return <AuditPage />;
    default:
      return (
        <div class="card" data-testid="not-found">
          <h1>Page not found</h1>
          <p>
            There is no page at <code>{location.pathname}</code>. <a href="/web/">Go to the resources</a>.
          </p>
        </div>
      );
  }
}

interface NavItem {
  page: Page;
  href: string;
  label: string;
  show: (s: CurrentSession) => boolean;
}

const NAV: readonly NavItem[] = [
  { page: 'resources', href: '/web/', label: 'Resources', show: () => true },
  { page: 'agents', href: '/web/agents', label: 'Agents', show: (s) => s.acl?.agents?.list !== false },
  { page: 'maintenance', href: '/web/maintenance', label: 'Maintenance window', show: (s) => s.acl?.maintenance?.read === true || s.acl?.maintenance?.grant === true },
  { page: 'tokens', href: '/web/tokens', label: 'Join tokens', show: (s) => s.acl?.tokens?.list === true },
  { page: 'audit', href: '/web/audit', label: 'Audit log', show: (s) => s.acl?.events?.list === true },
];

async function signOut(): Promise<void> {
  try {
    await api.signOut();
  } catch {
    // already gone on the server: signing out here is all that is left
  }
  bearer.clear();
  navigate('/web/login', { replace: true });
}

/**
 * The shell. At a phone's width (styles.css, under 760 px) the side navigation collapses behind the Menu button of
 * the top bar and opens as a list under it; it closes again on the next page.
 */
function Shell({ session, ping, page, children }: { session: CurrentSession; ping: Ping | undefined; page: Page; children: ComponentChildren }) {
  const expires = Date.parse(session.expires_at);
  const [navOpen, setNavOpen] = useState(false);
  useEffect(() => setNavOpen(false), [page]);
  return (
    <div class={navOpen ? 'shell nav-open' : 'shell'} onClick={linkClick}>
      <header class="topbar">
        <button type="button" class="btn btn-ghost nav-toggle" aria-controls="sidenav" aria-expanded={navOpen} onClick={() => setNavOpen((o) => !o)} data-testid="nav-toggle">
          <span class="nav-toggle-bars" aria-hidden="true" />
          Menu
        </button>
        <a class="brand" href="/web/">
          <span class="brand-mark" aria-hidden="true">G</span>
          Gateway
        </a>
        <span class="cluster" data-testid="cluster-name" title="Cluster">{ping?.cluster_name ?? ''}</span>
        <span class="spacer" />
        <span class="who" data-testid="current-user" title={`Roles: ${session.user.roles.join(', ')}`}>
          <span class="avatar" aria-hidden="true">{session.user.name.slice(0, 1).toUpperCase()}</span>
          <span>
            <span class="who-name">{session.user.name}</span>
            <span class="who-sub">{session.user.roles.join(', ')}{session.connector ? ` · via ${session.connector.display ?? session.connector.name}` : ''}{Number.isFinite(expires) ? ` · session ends ${relative(expires, Date.now())}` : ''}</span>
          </span>
        </span>
        <button type="button" class="btn btn-ghost" data-testid="signout" onClick={() => void signOut()}>Sign out</button>
      </header>
      <div class="frame">
        <nav class="sidenav" id="sidenav" aria-label="Main" onClick={() => setNavOpen(false)}>
          {NAV.filter((n) => n.show(session)).map((n) => (
            <a key={n.page} href={n.href} class={n.page === page ? 'active' : ''} data-testid={`nav-${n.page}`} aria-current={n.page === page ? 'page' : undefined}>
              {n.label}
            </a>
          ))}
          <div class="sidenav-foot muted">{ping ? `v${ping.server_version}` : ''}</div>
        </nav>
        <main class={page === 'terminal' ? 'content content-full' : 'content'}>{children}</main>
      </div>
    </div>
  );
}
