/**
 * Where an SSO callback lands: the cookie is set, the page asks for the session's bearer once
 * (POST /webapi/sessions/bearer) and goes on to where the sign-in started.
 */
import { useEffect, useState } from 'preact/hooks';
import { api, bearer } from '../api.js';
import { ErrorBox, Spinner } from '../components/ui.js';
import type { ApiError } from '../lib/errors.js';
import { safeRedirect } from '../lib/route.js';

export function SsoCompletePage({ onSignedIn }: { onSignedIn: (to: string) => void }) {
  const [error, setError] = useState<ApiError | Error | undefined>(undefined);
  useEffect(() => {
    const redirect = safeRedirect(new URLSearchParams(location.search).get('redirect'));
    api.ssoBearer().then(
      (r) => {
        bearer.set(r.token);
        onSignedIn(redirect);
      },
      (e: Error) => setError(e),
    );
  }, [onSignedIn]);
  return (
    <div class="login-page">
      <div class="login-card card" data-testid="sso-complete">
        {error ? (
          <>
            <h1>Single sign-on did not finish</h1>
            <ErrorBox error={error} testid="sso-error" />
            <a class="btn btn-primary btn-block" href="/web/login">Back to sign-in</a>
          </>
        ) : (
          <Spinner label="Finishing single sign-on…" />
        )}
      </div>
    </div>
  );
}
