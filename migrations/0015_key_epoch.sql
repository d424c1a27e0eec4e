-- sidefx schema, version 15: which attempts the provider still remembers.
--
-- An answer the provider stored under the key (a decline, a replay) speaks
-- for every attempt the provider remembers under it, and clears the
-- evidence that one of them may have been performed. After an operator
-- sends an effect again past its provider's key window, the provider has
-- forgotten the attempts before: an answer to the new request says nothing
-- of them. key_epoch is the first attempt the provider remembers (1 until
-- such a resend, then the resend's attempt); an answer for the key clears
-- the evidence of attempts from key_epoch on, never of those before.
ALTER TABLE {{schema}}.side_effects
  ADD COLUMN key_epoch integer NOT NULL DEFAULT 1;
